"""pix2pixhd's synthetic street scenes, built on the device, and the networks' input encoding."""

import jax
import jax.numpy as jnp


def _scene(cfg, rng):
  """One street-like label map, its instance ids, instance features and a matching image.

  A horizon splits two stuff classes; then `shapes` rectangles and ellipses of
  random classes are painted over it, each its own instance (id class*1000 + k,
  as Cityscapes numbers things). Each instance has one feature vector in [-1, 1],
  constant over its pixels, as the precomputed maps of --load_features are. The image
  colours each class from a fixed palette, with vertical shading and noise, so that
  labels predict pixels.
  """
  h, w, n_cls, n_shapes = cfg['height'], cfg['width'], cfg['label_nc'], cfg['shapes']
  n_feat = cfg['feat_num']
  # Two draws in all: every random draw costs XLA a separate (slow, on CPU) compile.
  shape_rng, noise_rng = jax.random.split(rng)
  u = jax.random.uniform(shape_rng, (3 + 6 * n_shapes + n_feat * (n_shapes + 2),))
  ys = (jnp.arange(h, dtype=jnp.float32)[:, None] + 0.5) / h
  xs = (jnp.arange(w, dtype=jnp.float32)[None, :] + 0.5) / w
  horizon = 0.35 + 0.3 * u[0]
  top, bottom = (u[1:3] * n_cls).astype(jnp.int32)
  label = jnp.where(ys < horizon, top, bottom) * jnp.ones((1, w), jnp.int32)
  instance = label
  features = 2.0 * u[3 + 6 * n_shapes :].reshape(n_shapes + 2, n_feat) - 1.0
  # One stuff class above and below the horizon is one instance, with one feature.
  below = jnp.where(top == bottom, features[0], features[1])
  feature = jnp.where((ys < horizon)[..., None], features[0], below) * jnp.ones((1, w, 1))
  per_shape = u[3 : 3 + 6 * n_shapes].reshape(6, n_shapes)
  centres = per_shape[0:2].T
  radii = 0.02 + 0.18 * per_shape[2:4].T
  classes = (per_shape[4] * n_cls).astype(jnp.int32)
  ellipse = per_shape[5] < 0.5

  def paint(k, maps):
    label, instance, feature = maps
    dy = (ys - centres[k, 0]) / radii[k, 0]
    dx = (xs - centres[k, 1]) / radii[k, 1]
    inside = jnp.where(
      ellipse[k], dy**2 + dx**2 <= 1.0, (jnp.abs(dy) <= 1.0) & (jnp.abs(dx) <= 1.0)
    )
    return (
      jnp.where(inside, classes[k], label),
      jnp.where(inside, classes[k] * 1000 + k + 1, instance),
      jnp.where(inside[..., None], features[k + 2], feature),
    )

  label, instance, feature = jax.lax.fori_loop(0, n_shapes, paint, (label, instance, feature))
  # A fixed colour per class, by formula: a literal random key would be constant-folded.
  palette = 0.8 * jnp.sin(
    jnp.arange(n_cls, dtype=jnp.float32)[:, None] * jnp.array([1.0, 2.39, 3.77]) + 1.0
  )
  image = palette[label] + 0.2 * (ys[..., None] - 0.5)
  image = image + 0.05 * jax.random.normal(noise_rng, (h, w, 3))
  return label, instance, feature, jnp.clip(image, -1.0, 1.0)


def make_batch(cfg, rng, n):
  """n label maps (int32 class ids), instance ids, instance feature maps and real images in
  [-1, 1], NHWC."""
  label, instance, feature, image = jax.vmap(lambda r: _scene(cfg, r))(jax.random.split(rng, n))
  return {'label': label, 'instance': instance, 'feature': feature, 'image': image}


def instance_edges(instance_BxHxW):
  """pix2pixHD's get_edges: a pixel is an edge if a 4-neighbour has another instance id."""
  dx = instance_BxHxW[:, :, 1:] != instance_BxHxW[:, :, :-1]
  dy = instance_BxHxW[:, 1:, :] != instance_BxHxW[:, :-1, :]
  pad = lambda d, widths: jnp.pad(d, ((0, 0),) + widths)
  return (
    pad(dx, ((0, 0), (1, 0)))
    | pad(dx, ((0, 0), (0, 1)))
    | pad(dy, ((1, 0), (0, 0)))
    | pad(dy, ((0, 1), (0, 0)))
  )


def encode_input(cfg, batch, dtype):
  """(the generator's input, the discriminators' condition), built in the step as the reference
  does: one-hot labels + instance edges, and for the generator the instance features after them
  (label_nc + 1 + feat_num channels; the discriminators see label_nc + 1 and the image)."""
  one_hot = jax.nn.one_hot(batch['label'], cfg['label_nc'], dtype=dtype)
  edges = instance_edges(batch['instance']).astype(dtype)[..., None]
  condition = jnp.concatenate([one_hot, edges], axis=-1)
  return jnp.concatenate([condition, batch['feature'].astype(dtype)], axis=-1), condition
