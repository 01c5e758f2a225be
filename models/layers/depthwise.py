"""Depthwise convolution: through cuDNN, as a sum of shifted, per-channel-scaled slices, or both.

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

At full memory the picture turns for deeplabv3: at 166 images cuDNN steps in 1,597 ms (103.9
images/s), the shifted sums in 1,285 ms (session 15). Its autotuning log there says why: the
depthwise weight gradients. The slowest, entry flow block 1's strided `separable_conv3`, takes
384 ms at its best candidate, and the five dilated layers' (exit flow block 2, the ASPP), which
XLA writes as forward convolutions with a 33x33 window over a batch of one, take 67-113 ms each;
timing their candidates took 454 s of the 552 s of candidate runs in that 1,264 s compile. The
forward convolutions of the dilated layers take 10-18 ms.

'cudnn_tap_wgrad' keeps cuDNN's forward and input gradient and computes the weight gradient as
one multiply-and-reduce per tap: for tap (i, j), the sum over batch and output pixels of the
tap's input window times the output gradient, in float32. Each is an XLA reduction fusion that
reads the input and the gradient once, with nothing to autotune: for that 384 ms gradient, nine
reads of its 2.8 GB input would take some 5 ms at the H200's 4.8 TB/s. That is an estimate: this
form has run on a GPU only at 8 images (session 16: deeplabv3 bf16 169.3 images/s and a 65.0 s
compile, against cuDNN's 159.2 and 130.7 s). The parameters, the forward values and the
gradients are the grouped convolution's (tests/models/test_depthwise.py, and the whole of DeepLab
in tests/models/test_deeplab.py).
"""

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

IMPLS = ('cudnn', 'shifts', 'cudnn_tap_wgrad')
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
    return _grouped(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate)
  if impl == 'cudnn_tap_wgrad':
    return _grouped_tap_wgrad(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate)
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


# cuDNN's forward and input gradient, and the weight gradient as one reduction per tap: for tap
# (i, j) and channel c, the sum over batch and output pixels of the tap's input window times the
# output gradient, each a multiply-and-reduce fusion of XLA's that reads the input and the
# gradient at the memory's speed, with nothing to autotune. The residuals are the input and the
# kernel, as autodiff of the grouped convolution keeps.
@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _grouped_tap_wgrad(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate):
  return _grouped(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate)


def _grouped_tap_wgrad_fwd(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate):
  y = _grouped(x_NxHxWxC, kernel_KxKx1xC, stride, pads, rate)
  return y, (x_NxHxWxC, kernel_KxKx1xC)


def _grouped_tap_wgrad_bwd(stride, pads, rate, residuals, dy_NxHoxWoxC):
  x, kernel = residuals
  _, input_vjp = jax.vjp(lambda x: _grouped(x, kernel, stride, pads, rate), x)
  (dx,) = input_vjp(dy_NxHoxWoxC)
  k = kernel.shape[0]
  xp = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
  dy = dy_NxHoxWoxC.astype(jnp.float32)
  taps = [
    jnp.sum(_tap(xp, i, j, stride, rate, dy.shape[1:3]).astype(jnp.float32) * dy, axis=(0, 1, 2))
    for i in range(k)
    for j in range(k)
  ]
  dkernel = jnp.stack(taps).reshape(kernel.shape)  # K*K x C, row-major taps -> K x K x 1 x C
  return dx, dkernel.astype(kernel.dtype)


_grouped_tap_wgrad.defvjp(_grouped_tap_wgrad_fwd, _grouped_tap_wgrad_bwd)


# Rematerialized, so that the backward pass holds only the input and the kernel and recomputes
# the slices inside its own fusions, rather than whatever XLA makes of the per-tap float32 slices
# that autodiff would keep. (Not compared without it on the H200.)
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
