"""fairseq's ConvTBC: a temporal convolution computed with matrix products.

fconv (ConvS2S) convolves [batch, length, channels] sequences with K-tap kernels. fairseq's
ConvTBC computes that with matrix products on shifted views of the input, keeping only the input
and the kernel for the backward pass. conv_seq2seq's `conv_impl` chooses the form; both compute
the same function with the same FLOPs (checked against lax.conv in tests/models/test_fconv.py):
- 'gemm' (the default): ConvTBC's way, one GEMM per pass over the K shifted copies side by
  side, which XLA hands to cuBLAS;
- 'xla': lax.conv_general_dilated and autodiff, which XLA hands to cuDNN. On an H200 in fp32 at
  60,000 tokens it runs 41,648 target tokens/s against 49,839 with 'gemm', its autotuner's
  workspaces take the allocator's peak to 111 GB against 64 GB, and at 145,350 tokens cuDNN's
  autotuning makes the compile take 292 s.
"""

import functools

import jax
import jax.numpy as jnp

CONV_IMPLS = ('gemm', 'xla')


def _shifted(x_BxLxC: jax.Array, k: int, left: int) -> jax.Array:
  """[B, L, K*C]: the K shifted views of x side by side; view j holds x[t + j - left] at t
  (zero outside the sequence)."""
  length = x_BxLxC.shape[1]
  padded = jnp.pad(x_BxLxC, ((0, 0), (left, k - 1 - left), (0, 0)))
  return jnp.concatenate([padded[:, j : j + length] for j in range(k)], axis=-1)


def _taps(x_BxLxC: jax.Array, w_KxCxD: jax.Array, left: int) -> jax.Array:
  """sum_j x[t + j - left] @ w[j]: one GEMM over the K shifted copies side by side."""
  k, c, d = w_KxCxD.shape
  return jnp.einsum('blc,cd->bld', _shifted(x_BxLxC, k, left), w_KxCxD.reshape(k * c, d))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv_tbc(x_BxLxC: jax.Array, w_KxCxD: jax.Array, left: int) -> jax.Array:
  return _taps(x_BxLxC, w_KxCxD, left)


def _conv_tbc_fwd(x_BxLxC, w_KxCxD, left):
  # Only the input and the kernel are kept for the backward pass, as ConvTBC keeps them: the
  # K-times-wider shifted copy is rebuilt there, so it lives only inside each GEMM's pass.
  return _taps(x_BxLxC, w_KxCxD, left), (x_BxLxC, w_KxCxD)


def _conv_tbc_bwd(left, residuals, g_BxLxD):
  # As jax.checkpoint does: the barrier keeps XLA from merging the shifted copy rebuilt below
  # with the forward's identical one, which would then be kept alive until here.
  x_BxLxC, w_KxCxD = jax.lax.optimization_barrier(residuals)
  k, c, d = w_KxCxD.shape
  # dx[s] = sum_j g[s - j + left] @ w[j]^T: the same shifted GEMMs on g, taps reversed.
  dx = _taps(g_BxLxD, jnp.flip(w_KxCxD, 0).transpose(0, 2, 1), k - 1 - left)
  # dw[j] = sum_t x[t + j - left]^T g[t].
  dw = jnp.einsum('blc,bld->cd', _shifted(x_BxLxC, k, left), g_BxLxD).reshape(k, c, d)
  return dx.astype(x_BxLxC.dtype), dw.astype(w_KxCxD.dtype)


_conv_tbc.defvjp(_conv_tbc_fwd, _conv_tbc_bwd)


def temporal_conv(
  x_BxLxC: jax.Array, w_KxCxD: jax.Array, causal: bool, impl: str = 'gemm'
) -> jax.Array:
  """Output t = sum_j x[t + j - left] @ w[j] (zero outside the sequence).

  left = K-1 when causal, else K//2 (with K//2 on the right): the same as a 'same'/causal
  convolution. impl (CONV_IMPLS, the module docstring):
    'gemm': each pass one GEMM over the K shifted copies side by side
      ([B*L, K*Cin] x [K*Cin, Cout]); the backward pass keeps only x and w (_conv_tbc_fwd).
    'xla': lax.conv_general_dilated, i.e. cuDNN on a GPU, and autodiff.
  """
  k = w_KxCxD.shape[0]
  left = k - 1 if causal else k // 2
  if impl == 'xla':
    return jax.lax.conv_general_dilated(
      x_BxLxC, w_KxCxD, (1,), ((left, k - 1 - left),), dimension_numbers=('NWC', 'WIO', 'NWC')
    )
  if impl not in CONV_IMPLS:
    raise ValueError(f'conv_impl must be one of {", ".join(CONV_IMPLS)}, got {impl!r}')
  if k == 1:
    return jnp.einsum('blc,cd->bld', x_BxLxC, w_KxCxD[0])
  return _conv_tbc(x_BxLxC, w_KxCxD, left)
