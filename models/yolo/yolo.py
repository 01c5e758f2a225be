"""YOLOv3 (Redmon & Farhadi 2018): Darknet-53, three detection scales, as darknet's yolov3.cfg."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models import workload as wl
from models.layers import rbg_init
from models.yolo import targets

# yolov3.cfg's nine COCO anchors in pixels of the 608x608 network input, smallest first.
COCO_ANCHORS = (
  (10, 13),
  (16, 30),
  (33, 23),
  (30, 61),
  (62, 45),
  (59, 119),
  (116, 90),
  (156, 198),
  (373, 326),
)
# Outputs come coarsest first (strides 32, 16, 8); each takes three anchors.
ANCHOR_MASKS = ((6, 7, 8), (3, 4, 5), (0, 1, 2))
# darknet's weight init: uniform in +-sqrt(2 / fan_in), i.e. variance 2 / (3 fan_in).
DARKNET_INIT = rbg_init.rbg(nn.initializers.variance_scaling(2.0 / 3.0, 'fan_in', 'uniform'))


class ConvBNLeaky(nn.Module):
  """darknet's [convolutional] with batch_normalize=1: symmetric pad k//2, BN, leaky ReLU 0.1."""

  features: int
  kernel: int = 1
  stride: int = 1
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train):
    pad = self.kernel // 2
    x = nn.Conv(
      self.features,
      (self.kernel, self.kernel),
      strides=self.stride,
      padding=((pad, pad), (pad, pad)),
      use_bias=False,
      kernel_init=DARKNET_INIT,
      dtype=self.dtype,
      name='conv',
    )(x)
    # darknet's rolling statistics: 0.99 * old + 0.01 * batch.
    x = nn.BatchNorm(
      use_running_average=not train, momentum=0.99, epsilon=1e-5, dtype=self.dtype, name='bn'
    )(x)
    return nn.leaky_relu(x, 0.1)


class Darknet53(nn.Module):
  """Stem, then five stages of a strided 3x3 convolution and residual (1x1, 3x3) blocks.

  Returns the outputs of the last three stages (strides 8, 16, 32).
  """

  width: int
  blocks: tuple[int, ...]
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train):
    x = ConvBNLeaky(self.width, 3, dtype=self.dtype, name='stem')(x, train)
    stages = []
    for i, count in enumerate(self.blocks):
      channels = self.width * 2 ** (i + 1)
      x = ConvBNLeaky(channels, 3, 2, dtype=self.dtype, name=f'down{i}')(x, train)
      for j in range(count):
        y = ConvBNLeaky(channels // 2, 1, dtype=self.dtype, name=f'stage{i}_{j}_a')(x, train)
        x = x + ConvBNLeaky(channels, 3, dtype=self.dtype, name=f'stage{i}_{j}_b')(y, train)
      stages.append(x)
    return stages[-3:]


class YOLOv3(nn.Module):
  """Darknet-53 and the three YOLOv3 heads with their upsampling routes.

  Returns raw outputs per scale, coarsest first, shaped (B, G, G, 3, 5 + classes):
  tx, ty, tw, th, objectness, class logits.
  """

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch, train):
    cfg, dtype = self.cfg, self.dtype
    images = batch['images'].astype(dtype)
    c3, c4, c5 = Darknet53(cfg['width'], tuple(cfg['blocks']), dtype, name='darknet53')(
      images, train
    )
    conv = lambda f, k, name: ConvBNLeaky(f, k, dtype=dtype, name=name)
    outputs, x = [], c5
    per_anchor = 5 + cfg['classes']
    for s, lateral in enumerate([None, c4, c3]):
      f = cfg['width'] * 16 // 2**s  # 512, 256, 128
      if lateral is not None:
        x = conv(f, 1, f'route{s}')(x, train)
        x = x.repeat(2, axis=1).repeat(2, axis=2)  # [upsample] stride 2, nearest
        x = jnp.concatenate([x, lateral], -1)
      for i in range(5):
        x = conv(f if i % 2 == 0 else 2 * f, 1 if i % 2 == 0 else 3, f'head{s}_{i}')(x, train)
      y = conv(2 * f, 3, f'head{s}_5')(x, train)
      y = nn.Conv(3 * per_anchor, (1, 1), kernel_init=DARKNET_INIT, dtype=dtype, name=f'detect{s}')(
        y
      )
      outputs.append(y.reshape(y.shape[:3] + (3, per_anchor)))
    return outputs


def anchors(cfg):
  """The anchors normalized to the network input, as darknet divides by its width and height."""
  return jnp.asarray(cfg['anchors'], jnp.float32) / cfg['image']


def make_batch(cfg, rng, n):
  """Noise images and 1..max_boxes/2 boxes per image of varied sizes and places, padded.

  Box sides are log-uniform from 2% to 80% of the image, each box lies inside
  the image; padding rows are zeros with valid=False.
  """
  img_rng, count_rng, size_rng, pos_rng, cls_rng = jax.random.split(rbg_init.rbg_key(rng), 5)
  m = cfg['max_boxes']
  counts = jax.random.randint(count_rng, (n, 1), 1, m // 2 + 1)
  valid = jnp.arange(m)[None] < counts
  wh = jnp.exp(jax.random.uniform(size_rng, (n, m, 2), jnp.float32, jnp.log(0.02), jnp.log(0.8)))
  xy = wh / 2 + jax.random.uniform(pos_rng, (n, m, 2), jnp.float32) * (1.0 - wh)
  boxes = jnp.where(valid[..., None], jnp.concatenate([xy, wh], -1), 0.0)
  classes = jnp.where(valid, jax.random.randint(cls_rng, (n, m), 0, cfg['classes']), 0)
  images = jax.random.uniform(img_rng, (n, cfg['image'], cfg['image'], 3), jnp.float32)
  return {'images': images, 'boxes': boxes, 'classes': classes, 'valid': valid}


def loss(cfg, outputs, batch):
  return targets.yolo_loss(
    outputs, batch['boxes'], batch['classes'], batch['valid'], anchors(cfg), ANCHOR_MASKS
  )


def darknet_schedule(cfg):
  """darknet's 'steps' policy with burn-in: lr * (step / burn_in)^4, then x0.1 at each step."""
  lr, burn_in = cfg['lr'], cfg['burn_in']

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    factor = jnp.prod(jnp.where(step >= jnp.asarray(cfg['lr_steps']), 0.1, 1.0))
    warm = (step / burn_in) ** 4 if burn_in else 1.0
    return lr * jnp.where(step < burn_in, warm, factor)

  return schedule


def optimizer(cfg):
  """SGD momentum 0.9; darknet decays convolution weights only (not BN or biases)."""
  decays = lambda params: jax.tree_util.tree_map_with_path(
    lambda path, _: path[-1].key == 'kernel', params
  )
  return optax.chain(
    optax.add_decayed_weights(cfg['weight_decay'], mask=decays),
    optax.sgd(darknet_schedule(cfg), momentum=cfg['momentum']),
  )


def flops_per_example(cfg):
  """Training FLOPs of one image: 3x the forward convolutions."""
  w, size = cfg['width'], cfg['image']
  conv = lambda k, cin, cout, hw: 2.0 * k * k * cin * cout * hw * hw
  forward, hw, sizes, chans = conv(3, 3, w, size), size, [], []
  for i, count in enumerate(cfg['blocks']):
    c = w * 2 ** (i + 1)
    hw = (hw - 1) // 2 + 1
    forward += conv(3, c // 2, c, hw) + count * (conv(1, c, c // 2, hw) + conv(3, c // 2, c, hw))
    sizes.append(hw)
    chans.append(c)
  cin, per_anchor = chans[-1], 5 + cfg['classes']
  for s in range(3):
    f, hw = w * 16 // 2**s, sizes[-1 - s]
    if s:
      forward += conv(1, cin, f, sizes[-s])
      cin = f + chans[-1 - s]
    forward += conv(1, cin, f, hw) + 2 * (conv(3, f, 2 * f, hw) + conv(1, 2 * f, f, hw))
    forward += conv(3, f, 2 * f, hw) + conv(1, 2 * f, 3 * per_anchor, hw)
    cin = f
  return 3.0 * forward


YOLOV3_CONFIG = dict(
  image=608,
  classes=80,
  width=32,
  blocks=(1, 2, 8, 8, 4),
  anchors=COCO_ANCHORS,
  max_boxes=50,
  lr=0.001,
  burn_in=1000,
  lr_steps=(400000, 450000),
  momentum=0.9,
  weight_decay=5e-4,
)
YOLOV3_TINY = dict(
  image=64,
  width=4,
  blocks=(1, 1, 1, 1, 1),
  max_boxes=8,
  lr=0.01,
  burn_in=0,
  # The COCO anchors rescaled to the 64x64 input, so they cover the same image fractions.
  anchors=tuple((a * 64 / 608, b * 64 / 608) for a, b in COCO_ANCHORS),
)


def check(cfg):
  image = cfg['image']
  return wl.first(
    (
      image % 32 != 0,
      f'image ({image}) must be a multiple of 32 (the stride of the coarsest scale)',
    )
  )


YOLOV3 = wl.Workload(
  name='yolov3',
  description='YOLOv3 (darknet yolov3.cfg): Darknet-53, three scales at 608x608, 80 classes',
  unit='images',
  throughput_unit='images/s',
  config=YOLOV3_CONFIG,
  tiny=YOLOV3_TINY,
  spec=dict(
    anchors=wl.Key(above=0, kind=float),  # nine (width, height) pairs in pixels, three a scale
    max_boxes=wl.Key(lo=2),
    burn_in=wl.NATURAL,
    lr_steps=wl.Key(lo=0, sized=False),
    momentum=wl.FRACTION,
  ),
  check=check,
  trainer=wl.supervised(lambda cfg, dtype: YOLOv3(cfg, dtype), make_batch, loss, optimizer),
  flops_per_example=flops_per_example,
  family='image',
  revision=2,
)
