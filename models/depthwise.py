"""Depthwise convolution as a sum of shifted, per-channel-scaled slices of the input.

A depthwise KxK convolution (one filter per channel: feature_group_count equal to the channel
count) does K*K multiply-adds per output element and is bound by memory, not arithmetic. XLA
hands `lax.conv_general_dilated` with feature groups to cuDNN, and on the H200 that costs twice:

- cuDNN's best depthwise algorithms are slow for these shapes in bf16 (deeplabv3 at 8 images,
  session 11: the depthwise convolutions' best candidates add up to 8.2 ms of a 50 ms step);
- XLA's autotuner times every cuDNN candidate at the step's own shapes, and for depthwise
  weight gradients some take seconds at 8 images and grow with the batch: 28 of the 37 s of
  measured candidate time in that compile, and full-memory bf16 compiles that outlast a
  session (stylegan, deeplabv3).

Written as K*K strided slices of the padded input, each times its tap's per-channel weight and
summed in float32, the convolution is one elementwise XLA fusion: nothing to autotune, and it
fuses with the batch norm or activation around it. Autodiff gives the input gradient as the
same fusion of padded slices and each tap's weight gradient as a reduction over batch and
space. TensorFlow, which the 2020 benchmark's DeepLab and NASNet ran on, likewise computes
depthwise convolutions with its own kernels rather than cuDNN's grouped convolutions.

`impl='cudnn'` keeps XLA's grouped convolution, for comparison and for results recorded with it
(sessions 1-12).
"""

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

IMPLS = ('shifts', 'cudnn')
_NHWC = ('NHWC', 'HWIO', 'NHWC')

Padding = str | Sequence[tuple[int, int]]


def _pads(size_hw, kernel: int, stride: int, rate: int, padding: Padding):
  effective = kernel + (kernel - 1) * (rate - 1)
  if isinstance(padding, str):
    padding = jax.lax.padtype_to_pads(size_hw, (effective, effective), (stride, stride), padding)
  return tuple((int(lo), int(hi)) for lo, hi in padding)


def depthwise_conv(
  x_NxHxWxC,
  kernel_KxKx1xC,
  stride: int = 1,
  padding: Padding = 'SAME',
  rate: int = 1,
  impl: str = 'shifts',
):
  """lax.conv_general_dilated(x, kernel, feature_group_count=C) for NHWC input, HWIO kernel.

  `padding` is 'SAME', 'VALID' or explicit ((top, bottom), (left, right)); `rate` dilates the
  kernel. The output has the input's dtype; the shifted sum accumulates in float32, as cuDNN
  does for bf16 and fp16 inputs.
  """
  n, h, w, c = x_NxHxWxC.shape
  k = kernel_KxKx1xC.shape[0]
  if kernel_KxKx1xC.shape != (k, k, 1, c):
    raise ValueError(
      f'a depthwise kernel for {c} channels is ({k}, {k}, 1, {c}), got {kernel_KxKx1xC.shape}'
    )
  pads = _pads((h, w), k, stride, rate, padding)
  if impl == 'cudnn':
    return jax.lax.conv_general_dilated(
      x_NxHxWxC,
      kernel_KxKx1xC,
      (stride, stride),
      pads,
      rhs_dilation=(rate, rate),
      dimension_numbers=_NHWC,
      feature_group_count=c,
    )
  if impl != 'shifts':
    raise ValueError(f'depthwise impl must be one of {", ".join(IMPLS)}, got {impl!r}')
  return _shifted_sum(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate)


# Rematerialized: the backward pass keeps only the input and the kernel and recomputes the
# slices, which are free inside its fusions. Without it autodiff keeps each tap's float32 slice
# for the weight gradient, and XLA may materialize them (on the CPU it did: deeplabv3 at two
# images forecast 10.8 GB of temporaries, against 5.5 GB with the grouped convolution).
@functools.partial(jax.checkpoint, static_argnums=(2, 3, 4))
def _shifted_sum(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate):
  n, _, _, c = x_NxHxWxC.shape
  k = kernel_KxKx1xC.shape[0]
  xp = jnp.pad(x_NxHxWxC, ((0, 0), pads[0], pads[1], (0, 0)))
  effective = (k - 1) * rate + 1
  ho = (xp.shape[1] - effective) // stride + 1
  wo = (xp.shape[2] - effective) // stride + 1
  patches = []
  for i in range(k):
    for j in range(k):
      start = (0, i * rate, j * rate, 0)
      limit = (n, i * rate + (ho - 1) * stride + 1, j * rate + (wo - 1) * stride + 1, c)
      patches.append(jax.lax.slice(xp, start, limit, (1, stride, stride, 1)))
  # The taps on a new minor axis, multiplied and summed there (not an einsum, which XLA would
  # make a matmul over materialized patches): autodiff then gives the weight gradient as one
  # reduction over batch and space for all K*K taps at once, reading the input and the output
  # gradient once, instead of one reduction per tap.
  stacked = jnp.stack(patches, axis=-1).astype(jnp.float32)  # N x Ho x Wo x C x K*K
  taps = kernel_KxKx1xC.reshape(k * k, c).T.astype(jnp.float32)  # C x K*K
  out = jnp.sum(stacked * taps, axis=-1)
  # Materialized in the input's dtype: left to itself, XLA keeps the float32 sum as the tensor
  # that the batch norm after it reads and the backward pass holds, twice the bytes under bf16
  # (deeplabv3 at 8 images, compiled for the H200: 8.58 GB against the grouped convolution's
  # 7.20 GB).
  return jax.lax.optimization_barrier(out.astype(x_NxHxWxC.dtype))


class DepthwiseConv(nn.Module):
  """A bias-free depthwise convolution with nn.Conv's parameter: `kernel`, (K, K, 1, C).

  Drop-in for nn.Conv(C, (K, K), feature_group_count=C, use_bias=False): the same parameter
  name, shape and initializer call, so parameter trees, counts and initial values are the same
  under either `impl`.
  """

  kernel_size: int
  strides: int = 1
  padding: Padding = 'SAME'
  rate: int = 1
  kernel_init: Callable[..., Any] = nn.initializers.lecun_normal()
  dtype: Any = jnp.float32
  impl: str = 'shifts'

  @nn.compact
  def __call__(self, x):
    k, c = self.kernel_size, x.shape[-1]
    kernel = self.param('kernel', self.kernel_init, (k, k, 1, c), jnp.float32)
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
    return depthwise_conv(x, kernel, self.strides, self.padding, self.rate, self.impl)

  def flops(self, out) -> float:
    """Forward FLOPs for the output `out`: 2*K*K per output element."""
    return 2.0 * self.kernel_size**2 * out.size
