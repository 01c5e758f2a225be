"""Attention with dropout in fused GPU kernels (Pallas on Triton), as PyTorch's fused attention.

XLA computes `softmax(QK^T) V` as separate kernels that write the [B, H, Lq, Lk] scores and
probabilities to memory and keep them for the backward pass; no fused attention that XLA
offers on a GPU draws dropout in float32. Here a forward kernel computes a block of queries
against every key with the online softmax of FlashAttention (Dao et al. 2022), draws the dropout
decisions in the kernel and writes only the output, the rows' log-sum-exp and the kept mask (a
byte per probability); two backward kernels compute dK, dV and dQ from them, recomputing the
probabilities. The [B, L, H, D] layout of the projections is read and written as it is, and a
self-attention's query, key and value can be read from the one [B, L, 3, H, D] array of the
product that computed them (packed_dot_product_attention).

The dropout decisions come from jax.random's threefry2x32 under the layer's key, one decision per
probability and independent across sequences and heads, drawn one of two ways
(`decisions_per_hash`). With 4, the default (DECISIONS_PER_HASH), each hash of a counter (a row's
group of four keys, numbered across [B, H, Lq]) gives four decisions of 16 bits
(threefry_bits.keep_mask_grouped): a quarter of the hash's arithmetic, which the forward kernel
does for every probability where its products are a few per tile; the probability of keeping is
then the nearest multiple of 2**-16 to 1 - rate (0.89999390 for BERT's 0.1), and the kept values
are scaled by its inverse. With 1 they are jax.random.bernoulli's on the [B, H, Lq, Lk] shape
(threefry2x32 of each element's flat index), so the values and gradients are those of
flax.linen.dot_product_attention with broadcast_dropout=False. `reference_attention` computes
either draw's values in XLA's operations (tests/models/test_fused_attention.py), up to the order
of the floating-point sums. The softmax runs in float32 under every precision (Flax's runs in
the compute dtype).

The kernels are in fused_attention_kernels; here they are gridded over (batch, head, block),
padded to their tiles and differentiated (a custom VJP). On a GPU they are compiled by XLA's
Triton pipeline; elsewhere (a CPU) the same kernels run in Pallas' interpreter, slowly, which is
what the CPU tests use.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from models.layers import fused_attention_kernels as kernels
from models.layers import threefry_bits
from models.layers.fused_attention_kernels import Spec


def tf32_products() -> bool:
  """Whether float32 matrix products run in TF32 on the tensor cores: the matrix-product precision
  in force (jax.default_matmul_precision, the policy's while a step is traced) is other than full
  float32. The GPU's default, with none set, is TF32."""
  return jax.config.jax_default_matmul_precision not in ('float32', 'highest')


def default_blocks(dtype, k_len: int, tf32: bool = True) -> dict:
  """The kernels' tiles and warps, for BERT's shapes ([B, L, 12, 64] at L 128 and 384). A float32
  tile of 128 x 128 with several key blocks needs more shared memory than an H200 has. Products
  in full float32 (`tf32` False) run on the CUDA cores, not the tensor cores, and want small tiles:
  on an H100 at bert_squad's [32, 384, 12, 64], 32 x 32 tiles ran the layer's forward and backward
  passes in 6.45 ms against 65.1 ms at the tensor cores' tiles (python -m
  jaxbench.attention_benchmark --precisions=fp32 --blocks=..., 2026-12-06)."""
  if jnp.dtype(dtype).itemsize == 2:
    if k_len <= 128:
      return dict(block_q=128, block_k=128, block_bwd=64, warps=8, warps_bwd=4, stages=2)
    return dict(block_q=64, block_k=64, block_bwd=64, warps=4, warps_bwd=4, stages=2)
  if not tf32:
    return dict(block_q=32, block_k=32, block_bwd=32, warps=4, warps_bwd=4, stages=2)
  if k_len <= 128:  # one key block: dQ, dK and dV in one backward kernel
    return dict(block_q=128, block_k=128, block_bwd=128, warps=8, warps_bwd=8, stages=2)
  return dict(block_q=128, block_k=64, block_bwd=64, warps=8, warps_bwd=4, stages=2)


# The kernels' dropout decisions per threefry hash when not given: four, the faster draw in the
# BERT family's bf16 steps (docs/performance.md, "Fused attention").
DECISIONS_PER_HASH = 4


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def _block(n: int, cap: int) -> int:
  return min(cap, max(16, pl.next_power_of_2(n)))


def _bases(batch: int, spec: Spec):
  """Each (batch, head)'s first hash counter (with one decision per hash, its first flat index
  in [B, H, Lq, Lk]), as uint32 (hi, lo) [B, H]."""
  rows = np.arange(batch * spec.heads, dtype=np.uint64) * np.uint64(spec.q_len)
  first = rows * np.uint64(spec.row_counters)
  hi = (first >> np.uint64(32)).astype(np.uint32).reshape(batch, spec.heads)
  lo = (first & np.uint64(0xFFFFFFFF)).astype(np.uint32).reshape(batch, spec.heads)
  return jnp.asarray(hi), jnp.asarray(lo)


# --- the calls: grids over (batch, head, block) on [B, L, H, D] arrays ---


def _seq(rows, d, head=0):
  """A [B, L, H, D] array's block: one head's `rows` rows from the grid's block index. `head`
  is where the heads start on the third axis: in a packed [B, L, 3H, D] array, the query's at
  0, the key's at H, the value's at 2H."""
  return pl.BlockSpec((None, rows, None, d), lambda b, h, i: (b, i, h + head, 0))


def _whole_seq(length, d, head=0):
  """A [B, L, H, D] array's block: one head's every row (`head` as in _seq)."""
  return pl.BlockSpec((None, length, None, d), lambda b, h, i: (b, 0, h + head, 0))


def _mask_spec(mask, rows, cols, by_rows):
  index = (lambda b, h, i: (b, 0, i, 0)) if by_rows else (lambda b, h, i: (b, 0, 0, i))
  if mask.shape[1] != 1:
    index = (lambda b, h, i: (b, h, i, 0)) if by_rows else (lambda b, h, i: (b, h, 0, i))
  return pl.BlockSpec((None, None, rows, cols), index)


def _rows_spec(rows):  # [B, H, Lq] float32 (log-sum-exp, delta)
  return pl.BlockSpec((None, None, rows), lambda b, h, i: (b, h, i))


def _all_rows_spec(full):
  return pl.BlockSpec((None, None, full), lambda b, h, i: (b, h, 0))


def _keep_spec(rows, cols, by_rows):
  index = (lambda b, h, i: (b, h, i, 0)) if by_rows else (lambda b, h, i: (b, h, 0, i))
  return pl.BlockSpec((None, None, rows, cols), index)


def _seed_specs():
  seed = pl.BlockSpec((2,), lambda b, h, i: (0,))
  base = pl.BlockSpec((None, None, 1), lambda b, h, i: (b, h, 0))
  return [seed, base, base]


def _call(kernel, warps, stages, grid, in_specs, out_specs, out_shape, interpret, *args):
  return pl.pallas_call(
    kernel,
    grid=grid,
    in_specs=in_specs,
    out_specs=out_specs,
    out_shape=out_shape,
    compiler_params=pltriton.CompilerParams(num_warps=warps, num_stages=stages),
    interpret=interpret,
  )(*args)


def _on_platform(fn, *args):
  """fn(*args, interpret) compiled as Triton kernels on a GPU, interpreted elsewhere."""
  return lax.platform_dependent(
    *args,
    cuda=functools.partial(fn, interpret=False),
    default=functools.partial(fn, interpret=True),
  )


def _forward(spec: Spec, seed, q, k, v, mask, heads_at=(0, 0, 0)):
  """heads_at: where q's, k's and v's heads start on their third axis (_seq)."""
  batch, lq, _, d = q.shape
  heads, lk = spec.heads, k.shape[1]
  at_q, at_k, at_v = heads_at
  bq = spec.block_q
  grid = (batch, heads, lq // bq)
  in_specs = [
    _seq(bq, d, at_q),
    _whole_seq(lk, d, at_k),
    _whole_seq(lk, d, at_v),
    _mask_spec(mask, bq, lk, True),
  ]
  out_specs = [_seq(bq, d), _rows_spec(bq), _rows_spec(bq)]
  rows = jax.ShapeDtypeStruct((batch, heads, lq), jnp.float32)
  out_shape = [jax.ShapeDtypeStruct((batch, lq, heads, d), q.dtype), rows, rows]
  args = [q, k, v, mask]
  if spec.dropout:
    hi, lo = _bases(batch, spec)
    in_specs = _seed_specs() + in_specs
    args = [seed, hi[..., None], lo[..., None]] + args
    out_specs.append(_keep_spec(bq, lk, True))
    out_shape.append(jax.ShapeDtypeStruct((batch, heads, lq, lk), jnp.int8))

  def run(*args, interpret):
    kernel = functools.partial(kernels.forward_kernel, spec)
    return tuple(
      _call(kernel, spec.warps, spec.stages, grid, in_specs, out_specs, out_shape, interpret, *args)
    )

  outs = _on_platform(run, *args)
  return outs if spec.dropout else (*outs, None)


def _backward(spec: Spec, q, k, v, mask, o, row_max, log_sum, kept, do, heads_at=(0, 0, 0)):
  """dQ, dK and dV, [B, L, H, D] each (heads_at as in _forward)."""
  batch, lq, _, d = q.shape
  heads, lk = spec.heads, k.shape[1]
  at_q, at_k, at_v = heads_at
  b = spec.block_bwd
  delta = jnp.einsum('blhd,blhd->bhl', o.astype(jnp.float32), do.astype(jnp.float32))
  common = [q, k, v, do, mask, row_max, log_sum, delta] + ([kept] if spec.dropout else [])

  dkdv_specs = [
    _whole_seq(lq, d, at_q),
    _seq(b, d, at_k),
    _seq(b, d, at_v),
    _whole_seq(lq, d),
    _mask_spec(mask, lq, b, False),
    _all_rows_spec(lq),
    _all_rows_spec(lq),
    _all_rows_spec(lq),
  ] + ([_keep_spec(lq, b, False)] if spec.dropout else [])
  dq_specs = [
    _seq(b, d, at_q),
    _whole_seq(lk, d, at_k),
    _whole_seq(lk, d, at_v),
    _seq(b, d),
    _mask_spec(mask, b, lk, True),
    _rows_spec(b),
    _rows_spec(b),
    _rows_spec(b),
  ] + ([_keep_spec(b, lk, True)] if spec.dropout else [])

  with_dq = spec.one_key_block(lk)
  q_grad = jax.ShapeDtypeStruct((batch, lq, heads, d), q.dtype)
  dkdv_out_specs = [_seq(b, d), _seq(b, d)] + ([_whole_seq(lq, d)] if with_dq else [])
  dkdv_shapes = [
    jax.ShapeDtypeStruct((batch, lk, heads, d), k.dtype),
    jax.ShapeDtypeStruct((batch, lk, heads, d), v.dtype),
  ]
  dkdv_shapes += [q_grad] if with_dq else []
  warps, stages = spec.warps_bwd, spec.stages

  def run(*args, interpret):
    grads = _call(
      functools.partial(kernels.dkdv_kernel, spec, with_dq),
      warps,
      stages,
      (batch, heads, lk // b),
      dkdv_specs,
      dkdv_out_specs,
      dkdv_shapes,
      interpret,
      *args,
    )
    if with_dq:
      dk, dv, dq = grads
      return dq, dk, dv
    dk, dv = grads
    dq = _call(
      functools.partial(kernels.dq_kernel, spec),
      warps,
      stages,
      (batch, heads, lq // b),
      dq_specs,
      _seq(b, d),
      q_grad,
      interpret,
      *args,
    )
    return dq, dk, dv

  return _on_platform(run, *common)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(spec, seed, q, k, v, mask):
  return _forward(spec, seed, q, k, v, mask)[0]


def _attention_fwd(spec, seed, q, k, v, mask):
  o, row_max, log_sum, kept = _forward(spec, seed, q, k, v, mask)
  return o, (q, k, v, mask, o, row_max, log_sum, kept)


def _attention_bwd(spec, residuals, do):
  dq, dk, dv = _backward(spec, *residuals, do)
  return None, dq, dk, dv, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def _heads_at(spec: Spec):
  """Where a packed [B, L, 3H, D] array's query, key and value heads start."""
  return (0, spec.heads, 2 * spec.heads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _packed_attention(spec, seed, qkv, mask):
  return _forward(spec, seed, qkv, qkv, qkv, mask, _heads_at(spec))[0]


def _packed_attention_fwd(spec, seed, qkv, mask):
  o, row_max, log_sum, kept = _forward(spec, seed, qkv, qkv, qkv, mask, _heads_at(spec))
  return o, (qkv, mask, o, row_max, log_sum, kept)


def _packed_attention_bwd(spec, residuals, do):
  qkv, mask, *rest = residuals
  grads = _backward(spec, qkv, qkv, qkv, mask, *rest, do, heads_at=_heads_at(spec))
  return None, jnp.concatenate(grads, axis=2), None


_packed_attention.defvjp(_packed_attention_fwd, _packed_attention_bwd)


def _pad(x, axis, to):
  if x.shape[axis] == to:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, to - x.shape[axis])
  return jnp.pad(x, widths)


def _keep(rate: float, per_hash: int) -> float:
  """The probability of keeping a probability that the kernels draw with."""
  return 1.0 - rate if per_hash == 1 else threefry_bits.grouped_keep(1.0 - rate)


def reference_attention(
  query,
  key,
  value,
  mask=None,
  dropout_rng=None,
  dropout_rate: float = 0.0,
  deterministic: bool = False,
  decisions_per_hash: int | None = None,
):
  """The values dot_product_attention's kernels compute, in XLA's operations: Flax's attention
  weights, dropped by the kernels' decisions for the same key (threefry_bits.keep_mask_array)
  and scaled as Flax scales them, times the values. A reference for tests and benchmarks: it
  writes every [B, H, Lq, Lk] array."""
  if decisions_per_hash is None:
    decisions_per_hash = DECISIONS_PER_HASH
  weights = nn.dot_product_attention_weights(query, key, mask=mask, deterministic=True)
  if not deterministic and dropout_rate > 0.0:
    keep = _keep(dropout_rate, decisions_per_hash)
    kept = threefry_bits.keep_mask_array(dropout_rng, weights.shape, keep, decisions_per_hash)
    weights = weights * (kept.astype(weights.dtype) / jnp.asarray(keep, weights.dtype))
  return jnp.einsum('...hqk,...khd->...qhd', weights, value)


def _prepare(
  batch,
  lq,
  lk,
  heads,
  d,
  dtype,
  mask,
  bias,
  broadcast_dropout,
  dropout_rng,
  dropout_rate,
  deterministic,
  blocks,
  decisions_per_hash,
):
  """The checks, the Spec, the padded lengths (query, key, depth), the mask padded to them and
  the dropout's seed of one attention call."""
  if bias is not None:
    raise ValueError('fused attention takes a mask, not an additive bias')
  dropout = not deterministic and dropout_rate > 0.0
  if dropout and broadcast_dropout:
    raise ValueError('fused attention draws dropout per batch and head (broadcast_dropout=False)')
  if dropout and str(jax.random.key_impl(dropout_rng)) != 'threefry2x32':
    raise ValueError('fused attention draws its dropout as the threefry2x32 PRNG does')
  if decisions_per_hash is None:
    decisions_per_hash = DECISIONS_PER_HASH
  if decisions_per_hash not in (1, threefry_bits.GROUP):
    raise ValueError(f'decisions_per_hash must be 1 or {threefry_bits.GROUP}')
  if mask is None:
    mask = jnp.ones((batch, 1, lq, lk), jnp.int8)
  mask = jnp.broadcast_to(mask, (batch, mask.shape[1], lq, lk)).astype(jnp.int8)
  tf32 = tf32_products()
  blocks = {**default_blocks(dtype, lk, tf32), **(blocks or {})}
  bq, bk = _block(lq, blocks['block_q']), _block(lk, blocks['block_k'])
  bb = _block(min(lq, lk), blocks['block_bwd'])
  lq_p, lk_p = _round_up(lq, max(bq, bb)), _round_up(lk, max(bk, bb))
  d_p = max(16, pl.next_power_of_2(d))
  spec = Spec(
    heads=heads,
    q_len=lq,
    k_len=lk,
    keep=_keep(dropout_rate, decisions_per_hash) if dropout else 1.0,
    scale=1.0 / math.sqrt(d),
    tf32=tf32,
    block_q=bq,
    block_k=bk,
    block_bwd=bb,
    warps=blocks['warps'],
    warps_bwd=blocks['warps_bwd'],
    stages=blocks['stages'],
    per_hash=decisions_per_hash,
  )
  mask = _pad(_pad(mask, 2, lq_p), 3, lk_p)
  seed = jax.random.key_data(dropout_rng).astype(jnp.uint32) if dropout else None
  return spec, (lq_p, lk_p, d_p), mask, seed


def dot_product_attention(
  query,
  key,
  value,
  bias=None,
  mask=None,
  broadcast_dropout: bool = True,
  dropout_rng=None,
  dropout_rate: float = 0.0,
  deterministic: bool = False,
  dtype=None,
  precision=None,
  force_fp32_for_softmax: bool = False,
  blocks: dict | None = None,
  decisions_per_hash: int | None = None,
):
  """flax.linen.dot_product_attention's signature, in fused kernels.

  query [B, Lq, H, D], key and value [B, Lk, H, D]; mask broadcastable to [B, 1 or H, Lq, Lk]
  (True or nonzero: attend). Dropout draws one decision per batch, head and probability
  (broadcast_dropout=False), decisions_per_hash of them per threefry hash (the module's docstring;
  None: DECISIONS_PER_HASH); the attention bias is not supported. The parameters are named for
  MultiHead (models/layers/attention.py), which passes an attention_fn only the ones it names."""
  del dtype, precision, force_fp32_for_softmax  # the kernels' products and softmax: see Spec
  batch, lq, heads, d = query.shape
  lk = key.shape[1]
  spec, (lq_p, lk_p, d_p), mask, seed = _prepare(
    batch, lq, lk, heads, d, query.dtype, mask, bias, broadcast_dropout, dropout_rng,
    dropout_rate, deterministic, blocks, decisions_per_hash,
  )  # fmt: skip
  q = _pad(_pad(query, 1, lq_p), 3, d_p)
  k = _pad(_pad(key, 1, lk_p), 3, d_p)
  v = _pad(_pad(value, 1, lk_p), 3, d_p)
  out = _attention(spec, seed, q, k, v, mask)
  return out[:, :lq, :, :d]


def packed_dot_product_attention(
  qkv,
  bias=None,
  mask=None,
  broadcast_dropout: bool = True,
  dropout_rng=None,
  dropout_rate: float = 0.0,
  deterministic: bool = False,
  dtype=None,
  precision=None,
  force_fp32_for_softmax: bool = False,
  blocks: dict | None = None,
  decisions_per_hash: int | None = None,
):
  """dot_product_attention of a self-attention's query, key and value packed as one array,
  qkv [B, L, 3, H, D] (the result of one product, as MultiHead computes them): the kernels read
  each from the packed array, where three arrays would be sliced out of it first, and the
  backward pass writes the gradient of the packed array. The same values and gradients as
  dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]) with the same arguments."""
  del dtype, precision, force_fp32_for_softmax
  batch, length, three, heads, d = qkv.shape
  if three != 3:
    raise ValueError(f'qkv must be [B, L, 3, H, D], got {qkv.shape}')
  spec, (lq_p, lk_p, d_p), mask, seed = _prepare(
    batch, length, length, heads, d, qkv.dtype, mask, bias, broadcast_dropout, dropout_rng,
    dropout_rate, deterministic, blocks, decisions_per_hash,
  )  # fmt: skip
  padded = max(lq_p, lk_p)  # a multiple of every block: they are powers of two
  mask = _pad(_pad(mask, 2, padded), 3, padded)
  packed = _pad(_pad(qkv.reshape(batch, length, 3 * heads, d), 1, padded), 3, d_p)
  out = _packed_attention(spec, seed, packed, mask)
  return out[:, :length, :, :d]
