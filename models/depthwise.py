"""Depthwise convolution, through cuDNN or as a sum of shifted, per-channel-scaled slices.

A depthwise KxK convolution (one filter per channel: feature_group_count equal to the channel
count) does K*K multiply-adds per output element. XLA hands `lax.conv_general_dilated` with
feature groups to cuDNN ('cudnn', the default), and on the H200 its autotuner times every cuDNN
candidate at the step's own shapes. For bf16 depthwise weight gradients some candidates take
seconds at 8 images and grow with the batch: deeplabv3 bf16's compile at 8 images spent 28 of
its 37 s of measured candidate time on depthwise convolutions (session 11), and its compile at
166 images outlasted 550 s (session 10).

'shifts' writes the convolution as K*K strided slices of the padded input, stacked on a minor
axis, scaled by the taps and summed in float32: XLA fusions with nothing to autotune. Measured
on the H200 in session 13 (docs/results/2026-12-01-h200-session13.md), it does what it was for
and costs the step:
- deeplabv3 bf16 at 8 images: 3.7 s of candidate time instead of 36.6 s, but 95.3 images/s
  against cuDNN's 159.2 (session 11); at its full-memory 166 images the whole search, probes and
  one autotuned compile, took 213 s (129.2 images/s);
- scripts/diag_depthwise.py (eight 3x3-7x7 layers, 128 images of 42x42, a train step): 301 ms
  in bf16 against cuDNN's 3.6 ms and 17.5 ms for session 8's one-product-per-tap version. So
  the stacked layout costs most of it; my guess, not profiled, is the weight gradient's
  reduction, whose minor tap axis strides the input by whole pixels.
- nasnet_large bf16 (5x5 and 7x7 kernels): 369 images fit, at 35.4 images/s; through cuDNN,
  360 images at 326.6 images/s (session 14);
- stylegan bf16's blur (a fixed 3x3 filter, as two separable 3-tap passes) at 8 images: a 19.1 s
  compile against cuDNN's 74.0 s, and 32.9 against 33.8 images/s (session 14);
- a tap-major stacking (scripts/diag_depthwise.py's `tap_major`) steps in 28.7 ms on that
  micro-benchmark, ten times faster than the minor stacking but still eight times slower than
  cuDNN (session 14).

So 'cudnn' stays the default, and 'shifts' is for runs that cannot wait for cuDNN's autotuning.
Its parameters are cuDNN's (the same tree, shapes and initial values) and its memory close to
it (7.16 against 7.20 GB forecast for deeplabv3 bf16 at 8 images; at full memory 166 images, as
the deviceless cuDNN forecast has it).
"""

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

IMPLS = ('cudnn', 'shifts')
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
  impl: str = 'cudnn',
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


# Rematerialized, so that the backward pass holds only the input and the kernel and recomputes
# the slices inside its own fusions, rather than whatever XLA makes of the per-tap float32 slices
# that autodiff would keep. (Not compared without it on the H200.)
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
  # reduction over batch and space for all K*K taps, instead of one reduction per tap. This is
  # the layout that stepped slowly on the H200 (the module's docstring).
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
  impl: str = 'cudnn'

  @nn.compact
  def __call__(self, x):
    k, c = self.kernel_size, x.shape[-1]
    kernel = self.param('kernel', self.kernel_init, (k, k, 1, c), jnp.float32)
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
    return depthwise_conv(x, kernel, self.strides, self.padding, self.rate, self.impl)

  def flops(self, out) -> float:
    """Forward FLOPs for the output `out`: 2*K*K per output element."""
    return 2.0 * self.kernel_size**2 * out.size
