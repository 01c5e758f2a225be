"""Depthwise convolution (one KxK filter per channel): through cuDNN, or as shifted sums.

'cudnn' is lax.conv_general_dilated with feature_group_count equal to the channel count, which
XLA hands to cuDNN's grouped convolution. On a GPU, XLA's autotuner times every cuDNN candidate
at the step's own shapes; for bf16 depthwise weight gradients a candidate takes seconds, more at
larger batches (deeplabv3 bf16 at 8 images spends 28 of its 37 s of candidate timing on them).

'shifts' writes the convolution as K*K strided slices of the padded input, stacked on a minor
axis, scaled by the taps and summed in float32: XLA fusions, with nothing to autotune.

Which wins depends on the model and the batch. On an H200 in bf16:
- deeplabv3 at 8 images: 159.2 images/s through cuDNN, 95.3 with shifts;
- deeplabv3 at its full-memory batch of 166 images: 103.9 images/s through cuDNN, 129.2 with
  shifts (cuDNN's slowest kernels there are the depthwise weight gradients), and the whole
  full-memory search takes 1,417 s through cuDNN against 213 s with shifts;
- nasnet_large (5x5 and 7x7 kernels) at full memory: 326.6 images/s through cuDNN, 35.4 with
  shifts;
- stylegan's blur (a fixed 3x3 filter, models/stylegan/layers.py) at 8 images, with its
  resampling convolutions in their transposed form: a 74.0 s compile through cuDNN against
  19.1 s with shifts, at 33.8 against 32.9 images/s.
'auto' is cuDNN except for dilated kernels (rate > 1), which it computes as shifted sums. cuDNN
has only its generic grouped direct kernel for a dilated depthwise convolution, and XLA runs the
input gradient through it as a forward convolution fused with the ReLU's mask: in a profile of
deeplabv3 in tf32 at 16 images on an H200, its six dilated depthwise convolutions (the exit
flow's at rate 2 and ASPP's at 6, 12 and 18, on 33x33 maps) took 52 of the step's 126 ms of
kernel time, 5.2 to 6.6 ms for each input gradient and 1.4 to 1.7 ms for each forward pass.
With 'auto' that step ran at 184.9 images/s, against 124.3 all through cuDNN (in one run).

'auto' is the default of deeplabv3, 'cudnn' that of nasnet_large (no dilated kernels), 'shifts'
that of stylegan's blur; a workload's `depthwise` config key chooses.

Both forms have nn.Conv's parameters (the same tree, shapes and initial values) and compute the
same function and gradients (tests/models/test_depthwise.py); their memory is close (deeplabv3
bf16 at 8 images forecasts 7.20 GB through cuDNN, 7.16 GB with shifts).
"""

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

IMPLS = ('cudnn', 'shifts', 'auto')
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
  if impl == 'auto':
    impl = 'shifts' if rate > 1 else 'cudnn'
  if impl == 'cudnn':
    return _grouped(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate)
  if impl != 'shifts':
    raise ValueError(f'depthwise impl must be one of {", ".join(IMPLS)}, got {impl!r}')
  return _shifted_sum(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate)


def _grouped(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate):
  return jax.lax.conv_general_dilated(
    x_NxHxWxC,
    kernel_KxKx1xC,
    (stride, stride),
    pads,
    rhs_dilation=(rate, rate),
    dimension_numbers=_NHWC,
    feature_group_count=x_NxHxWxC.shape[-1],
  )


def _tap(xp, tap_i, tap_j, stride, rate, out_hw):
  """The input window that tap (tap_i, tap_j) meets at every output pixel: N x Ho x Wo x C."""
  n, _, _, c = xp.shape
  ho, wo = out_hw
  start = (0, tap_i * rate, tap_j * rate, 0)
  limit = (n, tap_i * rate + (ho - 1) * stride + 1, tap_j * rate + (wo - 1) * stride + 1, c)
  return jax.lax.slice(xp, start, limit, (1, stride, stride, 1))


# Rematerialized, so that the backward pass holds only the input and the kernel and recomputes
# the slices inside its own fusions, rather than whatever XLA makes of the per-tap float32 slices
# that autodiff would keep.
@functools.partial(jax.checkpoint, static_argnums=(2, 3, 4))
def _shifted_sum(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate):
  c = x_NxHxWxC.shape[-1]
  k = kernel_KxKx1xC.shape[0]
  xp = jnp.pad(x_NxHxWxC, ((0, 0), pads[0], pads[1], (0, 0)))
  effective = (k - 1) * rate + 1
  ho = (xp.shape[1] - effective) // stride + 1
  wo = (xp.shape[2] - effective) // stride + 1
  patches = [_tap(xp, i, j, stride, rate, (ho, wo)) for i in range(k) for j in range(k)]
  # The taps on a new minor axis, multiplied and summed there (not an einsum, which XLA would
  # make a matmul over materialized patches): autodiff then gives the weight gradient as one
  # reduction over batch and space for all K*K taps, instead of one reduction per tap.
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
