"""DeepLabv3+ (Chen et al. 2018): aligned Xception-65, separable ASPP and decoder, PASCAL VOC."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from models import workload as wl
from models.deeplab import xception
from models.layers import depthwise, rbg_init

IGNORE_LABEL = 255
HEAD_BN_EPS = 1e-5  # DeepLab's ASPP and decoder batch norm
# model.py's _split_separable_conv2d and logits initializers; other head convs use slim's
# default (Glorot uniform).
SEP_DEPTHWISE_INIT = rbg_init.rbg(nn.initializers.truncated_normal(0.33))
SEP_POINTWISE_INIT = rbg_init.rbg(nn.initializers.truncated_normal(0.06))
LOGITS_INIT = rbg_init.rbg(nn.initializers.truncated_normal(0.01))
GLOROT = rbg_init.rbg(nn.initializers.glorot_uniform())


def scale_dimension(size: int, scale: float) -> int:
  """DeepLab's size of a feature map at 1/scale of a (size - 1)-divisible crop."""
  return int((size - 1) * scale + 1)


def align_corners_matrix(out: int, size: int) -> np.ndarray:
  """(out, size) bilinear weights with align_corners=True, as tf.image.resize_bilinear used.

  Built with numpy: a constant of the traced program, not work for the device.
  """
  if size == 1:
    return np.ones((out, 1), np.float32)
  src = np.arange(out, dtype=np.float64) * ((size - 1) / max(out - 1, 1))
  lo = np.clip(np.floor(src), 0, size - 2).astype(np.int64)
  frac = src - lo
  weights = np.zeros((out, size), np.float64)
  weights[np.arange(out), lo] = 1.0 - frac
  weights[np.arange(out), lo + 1] += frac
  return weights.astype(np.float32)


def resize_bilinear(x_BxHxWxC, height: int, width: int):
  """Bilinear resize with aligned corners, as two small matmuls (exact, and fast on GPUs)."""
  if x_BxHxWxC.shape[1:3] == (height, width):
    return x_BxHxWxC
  rows = jnp.asarray(align_corners_matrix(height, x_BxHxWxC.shape[1]), x_BxHxWxC.dtype)
  cols = jnp.asarray(align_corners_matrix(width, x_BxHxWxC.shape[2]), x_BxHxWxC.dtype)
  return jnp.einsum('oh,pw,bhwc->bopc', rows, cols, x_BxHxWxC)


def head_conv(features, dtype, name):
  """A 1x1 convolution, batch norm and ReLU of the ASPP and decoder."""
  return xception.ConvBN(
    features, 1, bn_eps=HEAD_BN_EPS, kernel_init=GLOROT, dtype=dtype, name=name
  )


def head_separable(features, rate, dtype, depthwise_impl, name):
  return xception.SeparableConv(
    features,
    rate=rate,
    activation=nn.relu,
    bn_eps=HEAD_BN_EPS,
    depthwise_init=SEP_DEPTHWISE_INIT,
    pointwise_init=SEP_POINTWISE_INIT,
    dtype=dtype,
    depthwise_impl=depthwise_impl,
    name=name,
  )


class DeepLabV3Plus(nn.Module):
  """Xception-65, ASPP (1x1, three atrous separable 3x3, image pooling), decoder, logits.

  Returns logits upsampled to the crop size, as DeepLab trains (upsample_logits).
  """

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch, train):
    cfg, dtype = self.cfg, self.dtype
    images = batch['images'].astype(dtype)
    features, low_level = xception.Xception65(cfg, dtype, name='xception_65')(images, train)
    height, width = features.shape[1:3]
    depth = cfg['aspp_depth']

    # ASPP. Image pooling averages the whole crop's feature map.
    pooled = jnp.mean(features, axis=(1, 2), keepdims=True)
    pooled = head_conv(depth, dtype, 'image_pooling')(pooled, train)
    branches = [
      jnp.broadcast_to(pooled, pooled.shape[:1] + (height, width, depth)),
      head_conv(depth, dtype, 'aspp0')(features, train),
    ]
    for i, rate in enumerate(cfg['atrous_rates'], 1):
      branches.append(
        head_separable(depth, rate, dtype, cfg['depthwise'], f'aspp{i}')(features, train)
      )
    x = head_conv(depth, dtype, 'concat_projection')(jnp.concatenate(branches, -1), train)
    x = nn.Dropout(cfg['aspp_dropout'], deterministic=not train)(x)

    # Decoder at output stride 4.
    crop = cfg['crop']
    dec = scale_dimension(crop, 1.0 / cfg['decoder_output_stride'])
    low = head_conv(cfg['projection_depth'], dtype, 'feature_projection0')(low_level, train)
    x = jnp.concatenate([resize_bilinear(x, dec, dec), resize_bilinear(low, dec, dec)], -1)
    for i in range(2):
      x = head_separable(cfg['decoder_depth'], 1, dtype, cfg['depthwise'], f'decoder_conv{i}')(
        x, train
      )

    logits = nn.Conv(cfg['classes'], (1, 1), kernel_init=LOGITS_INIT, dtype=dtype, name='logits')(x)
    return resize_bilinear(logits, crop, crop)


def make_batch(cfg, rng, n):
  """Images whose colour follows a blocky class map, and labels with 255 on region borders.

  The class map is a coarse random grid upsampled to the crop (plausible object
  regions); a band along each region boundary is labelled 255, as VOC marks
  object outlines 'void'.
  """
  map_rng, color_rng, noise_rng = jax.random.split(rbg_init.rbg_key(rng), 3)
  crop, grid, classes = cfg['crop'], cfg['label_grid'], cfg['classes']
  coarse = jax.random.randint(map_rng, (n, grid, grid), 0, classes, jnp.int32)
  pixels = jnp.arange(crop)
  cell = pixels * grid // crop
  before = jnp.maximum(pixels - cfg['ignore_band'], 0) * grid // crop  # no wrap-around
  labels = coarse[:, cell][:, :, cell]
  border = (labels != coarse[:, before][:, :, cell]) | (labels != coarse[:, cell][:, :, before])
  labels = jnp.where(border, IGNORE_LABEL, labels)
  palette = jax.random.uniform(color_rng, (classes + 1, 3), jnp.float32, -1.0, 1.0)
  noise = 0.3 * jax.random.normal(noise_rng, (n, crop, crop, 3), jnp.float32)
  # DeepLab feeds images scaled to [-1, 1].
  images = jnp.clip(palette[jnp.minimum(labels, classes)] + noise, -1.0, 1.0)
  return {'images': images, 'labels': labels}


def loss(cfg, logits_BxHxWxK, batch):
  """Mean per-pixel softmax cross-entropy over pixels not labelled 255."""
  del cfg
  labels = batch['labels']
  valid = labels != IGNORE_LABEL
  per_pixel = optax.softmax_cross_entropy_with_integer_labels(
    logits_BxHxWxK.astype(jnp.float32), jnp.where(valid, labels, 0)
  )
  weights = valid.astype(jnp.float32)
  value = (per_pixel * weights).sum() / jnp.maximum(weights.sum(), 1.0)
  return value, {'ignored_fraction': 1.0 - weights.mean()}


def decays(params):
  """L2 on convolution kernels only: no depthwise kernels, biases or batch-norm parameters."""
  return jax.tree_util.tree_map_with_path(
    lambda path, _: path[-1].key == 'kernel' and path[-2].key != 'depthwise', params
  )


def optimizer(cfg):
  """DeepLab's momentum SGD with the 'poly' schedule and L2 weight decay."""
  schedule = optax.polynomial_schedule(cfg['lr'], 0.0, cfg['lr_power'], cfg['total_steps'])
  return optax.chain(
    optax.add_decayed_weights(cfg['weight_decay'], mask=decays),
    optax.sgd(schedule, momentum=cfg['momentum']),
  )


def _resize_flops(size, out, channels):
  """The two matmuls of resize_bilinear (none when the size already matches)."""
  if size == out:
    return 0.0
  return 2.0 * out * size * size * channels + 2.0 * out * out * size * channels


def forward_flops(cfg, with_resizes=True):
  """Forward FLOPs of one crop: every convolution, and the resize matmuls if asked."""
  crop, depth = cfg['crop'], cfg['aspp_depth']
  forward, s, low_size = xception.xception_forward_flops(cfg, crop)
  cin = cfg['exit_depths'][-1][-1]
  rates = len(cfg['atrous_rates'])
  forward += 2.0 * cin * depth  # image pooling 1x1 on one pixel
  forward += 2.0 * s * s * cin * depth  # aspp0
  forward += rates * 2.0 * s * s * cin * (9 + depth)  # separable branches
  forward += 2.0 * s * s * (rates + 2) * depth * depth  # concat projection
  dec = scale_dimension(crop, 1.0 / cfg['decoder_output_stride'])
  proj, dd = cfg['projection_depth'], cfg['decoder_depth']
  forward += 2.0 * low_size * low_size * cfg['entry_depths'][1][1] * proj
  forward += 2.0 * dec * dec * ((depth + proj) * (9 + dd) + dd * (9 + dd))  # decoder separables
  forward += 2.0 * dec * dec * dd * cfg['classes']  # logits
  if with_resizes:
    forward += (
      _resize_flops(s, dec, depth)
      + _resize_flops(low_size, dec, proj)
      + _resize_flops(dec, crop, cfg['classes'])
    )
  return forward


def flops_per_example(cfg):
  """Training FLOPs of one crop: 3x the forward convolutions and resize matmuls."""
  return 3.0 * forward_flops(cfg)


DEEPLABV3_CONFIG = dict(
  crop=513,
  classes=21,
  output_stride=16,
  decoder_output_stride=4,
  stem=(32, 64),
  entry_depths=((128, 128, 128), (256, 256, 256), (728, 728, 728)),
  middle_depth=728,
  middle_blocks=16,
  exit_depths=((728, 1024, 1024), (1536, 1536, 2048)),
  atrous_rates=(6, 12, 18),
  aspp_depth=256,
  aspp_dropout=0.1,
  projection_depth=48,
  decoder_depth=256,
  # Synthetic labels: a label_grid x label_grid class map, 255 in a band along borders.
  label_grid=8,
  ignore_band=4,
  lr=0.007,
  lr_power=0.9,
  total_steps=30000,
  momentum=0.9,
  weight_decay=4e-5,
  # How the depthwise convolutions are computed (models/layers/depthwise.py): 'auto' is XLA's
  # cuDNN grouped convolution, except the dilated ones (exit flow and ASPP) as shifted sums, for
  # which cuDNN has only a slow generic kernel; 'cudnn' and 'shifts' use one form throughout. On
  # an H200 in bf16, all-cuDNN steps faster than all-shifts at 8 images (159.2 against 95.3
  # images/s) and slower at the full-memory 166 (103.9 against 129.2), where its autotuning makes
  # the search 1,417 s against 213 s.
  depthwise='auto',
)
DEEPLABV3_TINY = dict(
  crop=65,
  stem=(8, 8),
  entry_depths=((8, 8, 8), (16, 16, 16), (16, 16, 16)),
  middle_depth=16,
  middle_blocks=1,
  exit_depths=((16, 24, 24), (24, 24, 32)),
  atrous_rates=(1, 2, 3),
  aspp_depth=16,
  projection_depth=8,
  decoder_depth=16,
  label_grid=4,
  ignore_band=2,
  lr=0.05,
)


def check(cfg):
  crop, grid = cfg['crop'], cfg['label_grid']
  return wl.first((grid > crop, f'label_grid ({grid}) must be at most crop ({crop})'))


DEEPLABV3 = wl.Workload(
  name='deeplabv3',
  description='DeepLabv3+ with aligned Xception-65, output stride 16, 513x513 VOC crops',
  unit='images',
  throughput_unit='images/s',
  config=DEEPLABV3_CONFIG,
  tiny=DEEPLABV3_TINY,
  trainer=wl.supervised(lambda cfg, dtype: DeepLabV3Plus(cfg, dtype), make_batch, loss, optimizer),
  flops_per_example=flops_per_example,
  family='image',
  # 2: the dilated depthwise convolutions as shifted sums (depthwise='auto').
  revision=2,
  spec=dict(
    classes=wl.Key(lo=1, below=IGNORE_LABEL),
    # The backbone's four strides of 2 after its stem; the decoder's low-level features.
    output_stride=wl.Key(choices=(8, 16, 32)),
    decoder_output_stride=wl.Key(choices=(4,)),
    aspp_dropout=wl.FRACTION,
    ignore_band=wl.NATURAL,
    momentum=wl.FRACTION,
    depthwise=wl.Key(choices=depthwise.IMPLS),
  ),
  check=check,
)
