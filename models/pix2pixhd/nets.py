"""The networks of pix2pixHD (Wang et al. 2018): local-enhancer generator, multiscale PatchGAN.

Layer for layer as NVIDIA/pix2pixHD's models/networks.py (netG=local, norm=instance):
instance norm without affine parameters, reflection padding in the generator,
zero padding in the discriminators, every convolution with a bias.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models.layers import phases

# pix2pixHD's weights_init draws every convolution kernel from N(0, 0.02).
KERNEL_STD = 0.02
_conv_init = dict(kernel_init=nn.initializers.normal(KERNEL_STD), bias_init=nn.initializers.zeros)


def reflect_pad(x_BxHxWxC, p):
  return jnp.pad(x_BxHxWxC, ((0, 0), (p, p), (p, p), (0, 0)), mode='reflect')


def _window_counts(size):
  """How many of each 3-wide, stride-2, 1-padded window's taps fall inside `size`."""
  starts = 2 * np.arange((size + 1) // 2) - 1
  return np.minimum(starts + 3, size) - np.maximum(starts, 0)


def downsample(x_BxHxWxC):
  """AvgPool2d(3, stride 2, padding 1, count_include_pad=False): the input pyramid.

  The border divisors are numpy constants: flax's count_include_pad=False pools an
  array of ones, which XLA then constant-folds slowly at every call site.
  """
  h, w = x_BxHxWxC.shape[1:3]
  sums = nn.avg_pool(x_BxHxWxC, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1))) * 9.0
  inv_rows = (1.0 / _window_counts(h)).astype(np.float32)[:, None, None]
  inv_cols = (1.0 / _window_counts(w)).astype(np.float32)[None, :, None]
  return sums * inv_rows.astype(x_BxHxWxC.dtype) * inv_cols.astype(x_BxHxWxC.dtype)


# The generator upsamples with PhasedUp, pix2pixHD's ConvTranspose2d computed as one 2x2 stride-1
# convolution to the four output phases (4*O channels), interleaved (depth to space): its
# gradients are ordinary convolutions. The transposed convolution's weight gradient is taken
# against a gradient twice its input's size: XLA swaps that convolution's operands, reversing its
# window, and cuDNN gets a forward convolution whose window is the whole image (1023x2047 for
# local_up at 2048x1024, compiled for an H200) with 18,432 outputs. The phases cost 16
# taps where the transposed form has 9 non-zero ones: 1.78 times those layers' multiply-adds. On
# an H200 in bf16 the workload runs 24 images at 22.0 images/s, autotuned in 264 s.

# ConvTranspose2d(k=3, s=2, padding=1, output_padding=1) per axis: output 2j takes input j
# through tap 1; output 2j + 1 takes input j through tap 0 and input j + 1 through tap 2.
# _PHASES[phase, input offset (0, +1), tap].
_PHASES = np.array([[[0, 1, 0], [0, 0, 0]], [[1, 0, 0], [0, 0, 1]]], np.float32)


class PhasedUp(nn.Module):
  """nn.ConvTranspose(features, (3, 3), strides=(2, 2), padding=((1, 2), (1, 2))), computed as a
  2x2 convolution of the input to its four output phases: the same parameters ('kernel'
  3x3xIxO, 'bias') and the same function."""

  features: int
  dtype: Any = jnp.float32
  kernel_init: Any = _conv_init['kernel_init']
  bias_init: Any = _conv_init['bias_init']

  @nn.compact
  def __call__(self, x_BxHxWxI):
    i, o = x_BxHxWxI.shape[-1], self.features
    kernel = self.param('kernel', self.kernel_init, (3, 3, i, o))
    bias = self.param('bias', self.bias_init, (o,))
    y = jax.lax.conv_general_dilated(
      x_BxHxWxI.astype(self.dtype),
      phases.phase_kernel(_PHASES, kernel).astype(self.dtype),
      window_strides=(1, 1),
      padding=((0, 1), (0, 1)),
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
    )
    return phases.depth_to_space(y) + bias.astype(self.dtype)


class _Layers(nn.Module):
  """Shared constructors: every layer gets the compute dtype."""

  dtype: Any = jnp.float32

  def conv(self, ch, k, stride=1, padding=0, name=None):
    return nn.Conv(
      ch,
      (k, k),
      strides=(stride, stride),
      padding=padding,
      dtype=self.dtype,
      name=name,
      **_conv_init,
    )

  def up(self, ch, name=None):
    return PhasedUp(ch, dtype=self.dtype, name=name)

  def norm(self, x):
    # InstanceNorm2d(affine=False): no parameters; flax reduces in float32.
    return nn.InstanceNorm(epsilon=1e-5, use_bias=False, use_scale=False, dtype=self.dtype)(x)


class ResnetBlock(_Layers):
  """x + IN(conv3(pad(relu(IN(conv3(pad(x)))))))."""

  @nn.compact
  def __call__(self, x):
    ch = x.shape[-1]
    y = nn.relu(self.norm(self.conv(ch, 3)(reflect_pad(x, 1))))
    y = self.norm(self.conv(ch, 3)(reflect_pad(y, 1)))
    return x + y


class GlobalTrunk(_Layers):
  """The global generator without its final 7x7 convolution and tanh (dropped by netG=local)."""

  ngf: int = 64
  n_downsample: int = 4
  n_blocks: int = 9

  @nn.compact
  def __call__(self, x):
    x = nn.relu(self.norm(self.conv(self.ngf, 7, name='stem')(reflect_pad(x, 3))))
    for i in range(self.n_downsample):
      x = self.conv(self.ngf * 2 ** (i + 1), 3, stride=2, padding=1, name=f'down_{i}')(x)
      x = nn.relu(self.norm(x))
    for i in range(self.n_blocks):
      x = ResnetBlock(self.dtype, name=f'block_{i}')(x)
    for i in range(self.n_downsample):
      x = nn.relu(
        self.norm(self.up(self.ngf * 2 ** (self.n_downsample - i - 1), name=f'up_{i}')(x))
      )
    return x


class LocalEnhancer(_Layers):
  """Generator G1 (global, ngf*2, at half resolution) inside the enhancer G2 (ngf, full).

  One local enhancer, as the 2048x1024 Cityscapes model. Returns a tanh image.
  """

  ngf: int = 32
  n_downsample_global: int = 4
  n_blocks_global: int = 9
  n_blocks_local: int = 3
  output_nc: int = 3

  @nn.compact
  def __call__(self, x_BxHxWxC):
    x = x_BxHxWxC.astype(self.dtype)
    g = GlobalTrunk(
      self.dtype,
      self.ngf * 2,
      self.n_downsample_global,
      self.n_blocks_global,
      name='global',
    )(downsample(x))
    y = nn.relu(self.norm(self.conv(self.ngf, 7, name='local_stem')(reflect_pad(x, 3))))
    y = nn.relu(self.norm(self.conv(self.ngf * 2, 3, stride=2, padding=1, name='local_down')(y)))
    y = y + g
    for i in range(self.n_blocks_local):
      y = ResnetBlock(self.dtype, name=f'local_block_{i}')(y)
    y = nn.relu(self.norm(self.up(self.ngf, name='local_up')(y)))
    return jnp.tanh(self.conv(self.output_nc, 7, name='out')(reflect_pad(y, 3)))


class NLayerDiscriminator(_Layers):
  """The 70x70-style PatchGAN: every layer's output, for feature matching (getIntermFeat)."""

  ndf: int = 64
  n_layers: int = 3

  @nn.compact
  def __call__(self, x):
    lrelu = functools.partial(nn.leaky_relu, negative_slope=0.2)
    feats = [lrelu(self.conv(self.ndf, 4, stride=2, padding=2)(x))]
    nf = self.ndf
    for n in range(1, self.n_layers + 1):
      nf = min(nf * 2, 512)
      stride = 2 if n < self.n_layers else 1  # the last of these keeps the resolution
      feats.append(lrelu(self.norm(self.conv(nf, 4, stride=stride, padding=2)(feats[-1]))))
    feats.append(self.conv(1, 4, padding=2)(feats[-1]))  # patch scores, no sigmoid (LSGAN)
    return feats


class MultiscaleDiscriminator(_Layers):
  """num_D PatchGANs on the input, then on its 2x and 4x average-pooled copies."""

  ndf: int = 64
  n_layers: int = 3
  num_d: int = 3

  @nn.compact
  def __call__(self, x_BxHxWxC):
    x = x_BxHxWxC.astype(self.dtype)
    results = []
    for i in range(self.num_d):
      if i:
        x = downsample(x)
      results.append(NLayerDiscriminator(self.dtype, self.ndf, self.n_layers, name=f'scale_{i}')(x))
    return results


def conv_out(size, k, stride, pad):
  return (size + 2 * pad - k) // stride + 1


def generator_flops(cfg) -> float:
  """Forward FLOPs of the local-enhancer generator's convolutions on one image."""
  inp, ngf, h, w = cfg['label_nc'] + 1 + cfg['feat_num'], cfg['ngf'], cfg['height'], cfg['width']
  conv = lambda k, cin, cout, ho, wo: 2.0 * k * k * cin * cout * ho * wo
  gh, gw, g = h // 2, w // 2, 2 * ngf
  total = conv(7, inp, g, gh, gw)
  ch = g
  for _ in range(cfg['n_downsample_global']):
    gh, gw = gh // 2, gw // 2
    total += conv(3, ch, 2 * ch, gh, gw)
    ch *= 2
  total += cfg['n_blocks_global'] * 2 * conv(3, ch, ch, gh, gw)
  for _ in range(cfg['n_downsample_global']):
    total += conv(3, ch, ch // 2, gh, gw)  # a transposed conv: one kernel per input pixel
    ch, gh, gw = ch // 2, gh * 2, gw * 2
  total += conv(7, inp, ngf, h, w) + conv(3, ngf, 2 * ngf, h // 2, w // 2)
  total += cfg['n_blocks_local'] * 2 * conv(3, 2 * ngf, 2 * ngf, h // 2, w // 2)
  total += conv(3, 2 * ngf, ngf, h // 2, w // 2) + conv(7, ngf, cfg['output_nc'], h, w)
  return total


def discriminator_flops(cfg) -> float:
  """Forward FLOPs of all num_D PatchGANs on one image."""
  total, h, w = 0.0, cfg['height'], cfg['width']
  for i in range(cfg['num_D']):
    if i:
      h, w = conv_out(h, 3, 2, 1), conv_out(w, 3, 2, 1)
    cin, ho, wo, nf = cfg['label_nc'] + 1 + cfg['output_nc'], h, w, cfg['ndf']
    plan = [(nf, 2)]
    for n in range(1, cfg['n_layers_D'] + 1):
      nf = min(nf * 2, 512)
      plan.append((nf, 2 if n < cfg['n_layers_D'] else 1))
    plan.append((1, 1))
    for cout, stride in plan:
      ho, wo = conv_out(ho, 4, stride, 2), conv_out(wo, 4, stride, 2)
      total += 2.0 * 16 * cin * cout * ho * wo
      cin = cout
  return total


def build(cfg, dtype):
  """(generator, discriminator) modules at config `cfg` and compute dtype."""
  generator = LocalEnhancer(
    dtype,
    cfg['ngf'],
    cfg['n_downsample_global'],
    cfg['n_blocks_global'],
    cfg['n_blocks_local'],
    cfg['output_nc'],
  )
  discriminator = MultiscaleDiscriminator(dtype, cfg['ndf'], cfg['n_layers_D'], cfg['num_D'])
  return generator, discriminator
