"""Synthetic COCO-like batches for Mask R-CNN (He et al. 2017), built on the device.

Each image holds a random number of instances (1 to `max_real_instances`) under padding to
`max_instances`. An instance is a superellipse (exponent 1 = diamond, 2 = ellipse, large =
rectangle) inscribed in a box of log-uniform size and aspect ratio at a random position; it is
painted into the image in its own colour and its mask is rasterized on a grid over its box,
the form the mask targets are cut from. The image is mean-subtracted BGR (PIXEL_MEAN) padded
with zeros on the right from `content_size` to `image_size`, as maskrcnn-benchmark's
to_image_list pads to a size divisible by 32.
"""

import jax
import jax.numpy as jnp

from models.layers import rbg_init

# A tuple, not a jnp array: an array here would start the JAX backend on import.
PIXEL_MEAN = (102.9801, 115.9465, 122.7717)


def _inside(u, v, exponent):
  """Membership of box-normalized points (u, v in [0, 1]) in the inscribed superellipse."""
  inside_box = (u >= 0) & (u <= 1) & (v >= 0) & (v <= 1)
  return inside_box & (jnp.abs(2 * u - 1) ** exponent + jnp.abs(2 * v - 1) ** exponent <= 1)


def _instances(cfg, rng):
  """Boxes [G, 4], classes [G], valid [G], exponents [G] and colours [G, 3] of one image."""
  g = cfg['max_instances']
  height, width = cfg['content_size']
  # One draw, sliced into columns: each jax.random call adds its own hash to the program.
  u = jax.random.uniform(rng, (g + 1, 9))
  count = 1 + jnp.floor(u[g, 0] * cfg['max_real_instances']).astype(jnp.int32)
  valid = jnp.arange(g) < count
  u = u[:g]
  log_uniform = lambda x, lo, hi: jnp.exp(jnp.log(lo) + x * (jnp.log(hi) - jnp.log(lo)))
  side = log_uniform(u[:, 0], *cfg['box_size_range'])
  ratio = log_uniform(u[:, 1], 0.5, 2.0)
  w = jnp.minimum(side / jnp.sqrt(ratio), width - 1.0)
  h = jnp.minimum(side * jnp.sqrt(ratio), height - 1.0)
  x1, y1 = u[:, 2] * (width - w), u[:, 3] * (height - h)
  boxes = jnp.stack([x1, y1, x1 + w - 1, y1 + h - 1], axis=-1)  # x2 - x1 + 1 = w pixels
  boxes = jnp.where(valid[:, None], boxes, 0.0)
  classes = 1 + jnp.floor(u[:, 4] * (cfg['num_classes'] - 1)).astype(jnp.int32)
  classes = jnp.where(valid, jnp.minimum(classes, cfg['num_classes'] - 1), 0)
  exponent = log_uniform(u[:, 5], 1.0, 8.0)
  return boxes, classes, valid, exponent, 255.0 * u[:, 6:9]


def _image(cfg, rng, boxes, valid, exponent, colour):
  """Paint the instances in order (later ones on top) over a noisy background."""
  height, width = cfg['image_size']
  content_h, content_w = cfg['content_size']
  ys = jnp.arange(height, dtype=jnp.float32)[:, None] + 0.5
  xs = jnp.arange(width, dtype=jnp.float32)[None, :] + 0.5
  noise = jax.random.uniform(rng, (height, width, 3), minval=-1.0, maxval=1.0)
  image = colour.mean(axis=0) + 40.0 * noise  # a flat background of the mean colour

  def paint(image, instance):
    box, ok, p, c = instance
    u = (xs - box[0]) / (box[2] - box[0] + 1)
    v = (ys - box[1]) / (box[3] - box[1] + 1)
    hit = _inside(u, v, p) & ok
    return jnp.where(hit[..., None], c, image), None

  # A scan keeps one image live instead of a [G, H, W] stack of masks.
  image, _ = jax.lax.scan(paint, image, (boxes, valid, exponent, colour))
  # RGB -> BGR255 minus the mean, as the reference.
  image = image[..., ::-1] - jnp.asarray(PIXEL_MEAN, jnp.float32)
  content = (ys < content_h) & (xs < content_w)
  return jnp.where(content[..., None], image, 0.0)


def _gt_masks(cfg, valid, exponent):
  """[G, M, M] uint8 masks of each instance on an M x M grid over its own box."""
  m = cfg['gt_mask_size']
  cells = (jnp.arange(m, dtype=jnp.float32) + 0.5) / m
  masks = _inside(cells[None, None, :], cells[None, :, None], exponent[:, None, None])
  return (masks & valid[:, None, None]).astype(jnp.uint8)


def make_batch(cfg, rng, n):
  """n images with padded instances: images, boxes, classes, masks and a validity flag."""

  def one(key):
    inst_rng, img_rng = jax.random.split(key)
    boxes, classes, valid, exponent, colour = _instances(cfg, inst_rng)
    image = _image(cfg, img_rng, boxes, valid, exponent, colour)
    return {
      'images': image,
      'gt_boxes': boxes,
      'gt_classes': classes,
      'gt_masks': _gt_masks(cfg, valid, exponent),
      'gt_valid': valid,
    }

  # RBG keys: each threefry draw would compile its own hash kernel.
  return jax.vmap(one)(jax.random.split(rbg_init.rbg_key(rng), n))
