"""StyleGAN's layers (Karras et al. 2019): equalized learning rate, blur, resampling, AdaIN.

Weights are stored N(0, 1/lrmul) and scaled at run time by the He constant
gain/sqrt(fan_in) times lrmul, so Adam's step is equal for every layer
("equalized learning rate", NVlabs/stylegan's get_weight with use_wscale).
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models.layers import depthwise, phases

SQRT2 = math.sqrt(2.0)
_NHWC = ('NHWC', 'HWIO', 'NHWC')


def lrelu(x):
  return nn.leaky_relu(x, 0.2)


def pixel_norm(x, eps=1e-8):
  """Normalizes each feature vector (the last axis) to unit root mean square."""
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


def instance_norm(x_NxHxWxC, eps=1e-8):
  """Per-image, per-channel normalization over H and W, in float32 as the reference does."""
  x = x_NxHxWxC.astype(jnp.float32)
  x = x - jnp.mean(x, axis=(1, 2), keepdims=True)
  x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=(1, 2), keepdims=True) + eps)
  return x.astype(x_NxHxWxC.dtype)


def blur(x_NxHxWxC, impl='cudnn'):
  """The [1,2,1] x [1,2,1] / 16 low-pass filter, depthwise, zero-padded to the same size.

  `impl` is one of models/layers/depthwise.py's: 'cudnn', XLA's grouped convolution, or
  'shifts', shifted copies summed one axis at a time in float32 (one elementwise fusion, nothing
  for XLA to autotune); 'auto' is 'cudnn' for this undilated filter.
  """
  if impl in ('cudnn', 'auto'):
    c = x_NxHxWxC.shape[-1]
    f = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]) / 16.0
    kernel = jnp.asarray(np.tile(f[:, :, None, None], (1, 1, 1, c)), x_NxHxWxC.dtype)
    return depthwise.depthwise_conv(x_NxHxWxC, kernel, padding=((1, 1), (1, 1)), impl='cudnn')
  if impl != 'shifts':
    raise ValueError(f'blur impl must be one of {", ".join(depthwise.IMPLS)}, got {impl!r}')
  x = x_NxHxWxC.astype(jnp.float32)
  x = jnp.pad(x, ((0, 0), (1, 1), (0, 0), (0, 0)))
  x = 0.25 * x[:, :-2] + 0.5 * x[:, 1:-1] + 0.25 * x[:, 2:]
  x = jnp.pad(x, ((0, 0), (0, 0), (1, 1), (0, 0)))
  x = 0.25 * x[:, :, :-2] + 0.5 * x[:, :, 1:-1] + 0.25 * x[:, :, 2:]
  return x.astype(x_NxHxWxC.dtype)


def upscale(x_NxHxWxC):
  """Nearest-neighbour 2x upsampling."""
  return jnp.repeat(jnp.repeat(x_NxHxWxC, 2, axis=1), 2, axis=2)


def downscale(x_NxHxWxC):
  """2x2 average pooling."""
  n, h, w, c = x_NxHxWxC.shape
  return x_NxHxWxC.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def _summed_shifts(w_KxKxIxO):
  """The 4x4 kernel whose stride-2 use equals 2x resampling around the 3x3 kernel."""
  w = jnp.pad(w_KxKxIxO, ((1, 1), (1, 1), (0, 0), (0, 0)))
  return w[1:, 1:] + w[:-1, 1:] + w[1:, :-1] + w[:-1, :-1]


# A fused resampling convolution (EqConv's `fused`) runs as 3x3 stride-1 convolutions of the
# size of their input, whose gradients are ordinary convolutions: upsampling computes the four
# output phases as 4*O channels and interleaves them (depth to space); downsampling folds each
# 2x2 block of pixels into 4*I channels first (space to depth). 20 of each 36 taps are zero: 2.25
# times the multiply-adds of the reference's stride-2 4x4 convolution. That convolution, as XLA's
# transposed or strided one, has weight gradients (and, downsampling, R1's second-order terms)
# that reach cuDNN as forward convolutions with a window of half the image, whose bf16
# autotuning at full-memory batches does not end in 25 minutes on an H200; the phased form
# autotunes stylegan's 164-image bf16 maximum in 450 s.

# Nearest 2x upsampling then a 3x3 kernel (taps at offsets -1, 0, 1 on the upsampled grid), as
# taps on input rows i - 1, i, i + 1: _UP[a, input offset, kernel tap] for output row 2i + a.
_UP = np.array([[[1, 0, 0], [0, 1, 1], [0, 0, 0]], [[0, 0, 0], [1, 1, 0], [0, 0, 1]]], np.float32)
# The stride-2 4x4 kernel (padding 1) over 2x2 pixel blocks: tap t reads pixel 2m - 1 + t, that is
# block m - 1 + d in phase a: _DOWN[d, a, t].
_DOWN = np.zeros((3, 2, 4), np.float32)
for _t, (_d, _a) in enumerate(((0, 1), (1, 0), (1, 1), (2, 0))):
  _DOWN[_d, _a, _t] = 1.0


def _same3(x, k, conv):
  return conv(x, k, window_strides=(1, 1), padding=((1, 1), (1, 1)))


def _up_phases(x_NxHxWxI, w_3x3xIxO, conv):
  """upscale(x) then the 3x3 convolution (zero-padded), as one 3x3 convolution to 4*O channels."""
  return phases.depth_to_space(_same3(x_NxHxWxI, phases.phase_kernel(_UP, w_3x3xIxO), conv))


def _down_phases(x_NxHxWxI, k_4x4xIxO, conv):
  """The stride-2 4x4 convolution (padding 1) as a 3x3 one over 2x2 pixel blocks."""
  i = x_NxHxWxI.shape[-1]
  s = jnp.asarray(_DOWN, k_4x4xIxO.dtype)
  k = jnp.einsum('dat,ebu,tuio->deabio', s, s, k_4x4xIxO).reshape(3, 3, 4 * i, -1)
  return _same3(phases.space_to_depth(x_NxHxWxI), k, conv)


def minibatch_stddev(x_NxHxWxC, group_size=4, num_features=1):
  """Appends the within-group standard deviation, averaged over features and pixels.

  The reference needs the batch divisible by the group; here the group is the
  largest divisor of the batch not above `group_size`, so any batch works.
  Image i belongs to group i % M, as the reference's reshape assigns it.
  """
  n, h, w, c = x_NxHxWxC.shape
  g = max(d for d in range(1, min(group_size, n) + 1) if n % d == 0)
  y = x_NxHxWxC.astype(jnp.float32).reshape(g, n // g, h, w, num_features, c // num_features)
  y = jnp.sqrt(jnp.var(y, axis=0) + 1e-8)  # MxHxWxFxc
  y_MxF = jnp.mean(y, axis=(1, 2, 4))
  y_NxF = jnp.tile(y_MxF, (g, 1)).astype(x_NxHxWxC.dtype)
  y_NxHxWxF = jnp.broadcast_to(y_NxF[:, None, None, :], (n, h, w, num_features))
  return jnp.concatenate([x_NxHxWxC, y_NxHxWxF], axis=-1)


class EqDense(nn.Module):
  """Dense layer with equalized learning rate and a learning-rate multiplier."""

  features: int
  gain: float = SQRT2
  lrmul: float = 1.0
  use_bias: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    fan_in = x.shape[-1]
    w = self.param('kernel', nn.initializers.normal(1.0 / self.lrmul), (fan_in, self.features))
    scale = self.gain / math.sqrt(fan_in) * self.lrmul
    y = jnp.dot(x.astype(self.dtype), (w * scale).astype(self.dtype))
    if self.use_bias:
      b = self.param('bias', nn.initializers.zeros, (self.features,))
      y = y + (b * self.lrmul).astype(self.dtype)
    return y


class EqConv(nn.Module):
  """KxK convolution with equalized learning rate; optionally 2x up- or downsampling.

  resample='up': nearest 2x upsampling then the convolution; 'down': the convolution then 2x2
  average pooling. With `fused` (a 3x3 kernel), either runs as one convolution over pixel
  phases, exactly the same function as the separate operations at a fraction of their cost
  (the reference fuses from 128x128 up, as a stride-2 convolution of the 4x4 summed-shift
  kernel).
  """

  features: int
  kernel: int = 3
  gain: float = SQRT2
  resample: str | None = None  # None, 'up' or 'down'
  fused: bool = False
  use_bias: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_NxHxWxC):
    k, cin = self.kernel, x_NxHxWxC.shape[-1]
    if self.fused and self.resample and k != 3:
      raise ValueError(f'a fused resampling convolution takes a 3x3 kernel, not {k}x{k}')
    w = self.param('kernel', nn.initializers.normal(1.0), (k, k, cin, self.features))
    w = w * (self.gain / math.sqrt(k * k * cin))
    x = x_NxHxWxC.astype(self.dtype)
    same = ((k // 2, k // 2),) * 2
    conv = lambda x, w, **kw: jax.lax.conv_general_dilated(
      x, w.astype(self.dtype), dimension_numbers=_NHWC, **kw
    )
    if self.resample == 'up' and self.fused:
      y = _up_phases(x, w, conv)
    elif self.resample == 'down' and self.fused:
      y = _down_phases(x, _summed_shifts(w) * 0.25, conv)
    else:
      if self.resample == 'up':
        x = upscale(x)
      y = conv(x, w, window_strides=(1, 1), padding=same)
      if self.resample == 'down':
        y = downscale(y)
    if self.use_bias:
      b = self.param('bias', nn.initializers.zeros, (self.features,))
      y = y + b.astype(self.dtype)
    return y


class StyleMod(nn.Module):
  """AdaIN's affine part: a per-layer style (scale, bias) from W, gain 1."""

  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_NxHxWxC, w_NxD):
    c = x_NxHxWxC.shape[-1]
    style = EqDense(2 * c, gain=1.0, dtype=self.dtype, name='dense')(w_NxD)
    scale, bias = style[:, None, None, :c], style[:, None, None, c:]
    return x_NxHxWxC * (scale + 1) + bias


class LayerEpilogue(nn.Module):
  """What ends every synthesis layer: noise, bias, lrelu, instance norm, style modulation.

  The noise is one fresh N(0, 1) image per example and layer, scaled per
  channel by a learned strength that starts at zero.
  """

  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_NxHxWxC, w_NxD, noise_NxHxWx1):
    c = x_NxHxWxC.shape[-1]
    noise = noise_NxHxWx1.astype(self.dtype)
    strength = self.param('noise_strength', nn.initializers.zeros, (c,))
    bias = self.param('bias', nn.initializers.zeros, (c,))
    x = x_NxHxWxC + noise * strength.astype(self.dtype) + bias.astype(self.dtype)
    x = instance_norm(lrelu(x))
    return StyleMod(self.dtype, name='style')(x, w_NxD)
