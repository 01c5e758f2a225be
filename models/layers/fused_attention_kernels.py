"""The Pallas (Triton) kernels of fused_attention: a query block's forward pass with its dropout
drawn in the kernel, and the backward passes, dK and dV (with dQ when the keys fit one block) and
dQ. fused_attention grids them over (batch, head, block) and differentiates through them."""

import dataclasses

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from models.layers import threefry_bits

# What a masked score becomes: Flax's (the float32 minimum), so that a row with every key masked
# is uniform over its keys as in Flax. Keys added to fill a block get -inf and weigh nothing.
MASKED = float(np.finfo(np.float32).min)


@dataclasses.dataclass(frozen=True)
class Spec:
  """The static part of one attention call (hashable, for custom_vjp)."""

  heads: int
  q_len: int  # before padding to a block
  k_len: int
  keep: float  # the probability of keeping; 1.0: no dropout
  scale: float
  tf32: bool  # float32 products on TF32 tensor cores (tf32) or in full precision (fp32)
  block_q: int
  block_k: int
  block_bwd: int
  warps: int  # forward kernel
  warps_bwd: int
  stages: int
  # Dropout decisions per threefry hash: 1, jax.random.bernoulli's; 4, 16 bits each
  # (threefry_bits.keep_mask_grouped; keep is then threefry_bits.grouped_keep's).
  per_hash: int = 1

  @property
  def dropout(self) -> bool:
    return self.keep < 1.0

  @property
  def row_counters(self) -> int:
    """The hash counters of one row of keys: one per decision or one per group of per_hash."""
    return -(-self.k_len // self.per_hash)

  def one_key_block(self, k_len_padded: int) -> bool:
    """Whether the backward pass's key block holds every key: then one kernel computes dQ too,
    each query block's in full, and the probabilities are recomputed once, not twice."""
    return k_len_padded == self.block_bwd


def counters(spec: Spec, base_hi, base_lo, rows, cols):
  """The hash counter of each (row, col) of one (batch, head), cols numbering the row's counters:
  with one decision per hash, the flat index in [B, H, Lq, Lk]; (hi, lo)."""
  offset = (rows[:, None] * spec.row_counters + cols[None, :]).astype(jnp.uint32)
  lo = base_lo + offset
  hi = base_hi + (lo < offset).astype(jnp.uint32)
  return hi, lo


def _dot(a, b, spec: Spec, trans_b=False, trans_a=False):
  if a.dtype == jnp.float32:
    return pltriton.dot(a, b, trans_a=trans_a, trans_b=trans_b, allow_tf32=spec.tf32)
  return pltriton.dot(a, b, trans_a=trans_a, trans_b=trans_b)


def keep_tile(spec: Spec, k0, k1, base_hi, base_lo, rows, k_start, width):
  """The dropout decisions of the rows' keys k_start to k_start + width (a multiple of per_hash,
  as k_start is)."""
  if spec.per_hash == 1:
    hi, lo = counters(spec, base_hi, base_lo, rows, k_start + jnp.arange(width))
    return threefry_bits.keep_mask(k0, k1, hi, lo, spec.keep)
  groups = k_start // spec.per_hash + jnp.arange(width // spec.per_hash)
  hi, lo = counters(spec, base_hi, base_lo, rows, groups)
  return threefry_bits.keep_mask_grouped(k0, k1, hi, lo, spec.keep)


def _scores(spec: Spec, q, k, mask, q_start, k_start):
  """Scaled scores of a [bq, D] query block against a [bk, D] key block, masked as Flax."""
  s = _dot(q, k, spec, trans_b=True).astype(jnp.float32) * np.float32(spec.scale)
  s = jnp.where(mask != 0, s, MASKED)
  cols = k_start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
  return jnp.where(cols < spec.k_len, s, -jnp.inf)


def forward_kernel(spec: Spec, *refs):
  if spec.dropout:
    seed_ref, hi_ref, lo_ref = refs[:3]
    q_ref, k_ref, v_ref, mask_ref, o_ref, max_ref, log_sum_ref, keep_ref = refs[3:]
  else:
    q_ref, k_ref, v_ref, mask_ref, o_ref, max_ref, log_sum_ref = refs
  bq, bk = spec.block_q, spec.block_k
  q_start = pl.program_id(2) * bq
  q = q_ref[...]
  rows = q_start + jnp.arange(bq)

  def body(j, carry):
    acc, m, row_sum = carry
    k_start = j * bk
    cols = pl.ds(k_start, bk)
    s = _scores(spec, q, k_ref[cols, :], mask_ref[:, cols], q_start, k_start)
    m_new = jnp.maximum(m, s.max(axis=1))
    p = jnp.exp(s - m_new[:, None])
    correction = jnp.exp(m - m_new)
    row_sum = row_sum * correction + p.sum(axis=1)
    if spec.dropout:
      kept = keep_tile(spec, seed_ref[0], seed_ref[1], hi_ref[0], lo_ref[0], rows, k_start, bk)
      keep_ref[:, cols] = kept.astype(jnp.int8)
      p = jnp.where(kept, p, 0.0)
    v = v_ref[cols, :]
    acc = acc * correction[:, None] + _dot(p.astype(v.dtype), v, spec)
    return acc, m_new, row_sum

  d = q.shape[-1]
  init = (
    jnp.zeros((bq, d), jnp.float32),
    jnp.full((bq,), -jnp.inf, jnp.float32),
    jnp.zeros((bq,), jnp.float32),
  )
  acc, m, row_sum = lax.fori_loop(0, k_ref.shape[0] // bk, body, init)
  o_ref[...] = (acc / (row_sum[:, None] * np.float32(spec.keep))).astype(o_ref.dtype)
  # The rows' maxima and log-sums apart: a row with every key masked has its maximum at the
  # float32 minimum, which would absorb the log-sum if the two were added.
  max_ref[...] = m
  log_sum_ref[...] = jnp.log(row_sum)


def _probs_and_grad(spec: Spec, q, k, v, do, mask, row_max, log_sum, delta, kept, q_start, k_start):
  """The block's probabilities as dropped (for dV) and the scores' gradient (for dQ, dK)."""
  s = _scores(spec, q, k, mask, q_start, k_start)
  p = jnp.exp((s - row_max[:, None]) - log_sum[:, None])
  dp = _dot(do, v, spec, trans_b=True).astype(jnp.float32)
  if spec.dropout:
    inv = np.float32(1.0) / np.float32(spec.keep)
    p_dropped = jnp.where(kept != 0, p * inv, 0.0)
    dp = jnp.where(kept != 0, dp * inv, 0.0)
  else:
    p_dropped = p
  # A masked score is a constant in Flax (where(mask, s, min)): no gradient reaches Q or K
  # through it, which matters in a row with every key masked, where its probability is not 0.
  ds = jnp.where(mask != 0, p * (dp - delta[:, None]), 0.0)
  return p_dropped, ds


def dkdv_kernel(spec: Spec, with_dq: bool, *refs):
  """dK and dV of one key block, over every query block; with_dq: the block holds every key,
  and each query block's dQ is written too."""
  inputs = 9 if spec.dropout else 8
  q_ref, k_ref, v_ref, do_ref, mask_ref, max_ref, log_sum_ref, delta_ref = refs[:8]
  keep_ref = refs[8] if spec.dropout else None
  dk_ref, dv_ref = refs[inputs : inputs + 2]
  dq_ref = refs[inputs + 2] if with_dq else None
  b = spec.block_bwd
  k_start = pl.program_id(2) * b
  k, v = k_ref[...], v_ref[...]

  def body(i, carry):
    dk, dv = carry
    rows = pl.ds(i * b, b)
    q, do = q_ref[rows, :], do_ref[rows, :]
    kept = keep_ref[rows, :] if keep_ref is not None else None
    stats = max_ref[rows], log_sum_ref[rows], delta_ref[rows]
    p_dropped, ds = _probs_and_grad(
      spec, q, k, v, do, mask_ref[rows, :], *stats, kept, i * b, k_start
    )
    dv = dv + _dot(p_dropped.astype(do.dtype), do, spec, trans_a=True)
    ds = ds.astype(q.dtype)
    dk = dk + _dot(ds, q, spec, trans_a=True)
    if dq_ref is not None:
      dq_ref[rows, :] = (_dot(ds, k, spec) * np.float32(spec.scale)).astype(dq_ref.dtype)
    return dk, dv

  d = k.shape[-1]
  zeros = jnp.zeros((b, d), jnp.float32)
  dk, dv = lax.fori_loop(0, q_ref.shape[0] // b, body, (zeros, zeros))
  dk_ref[...] = (dk * np.float32(spec.scale)).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def dq_kernel(spec: Spec, *refs):
  """dQ of one query block, over every key block."""
  q_ref, k_ref, v_ref, do_ref, mask_ref, max_ref, log_sum_ref, delta_ref = refs[:8]
  keep_ref = refs[8] if spec.dropout else None
  dq_ref = refs[-1]
  b = spec.block_bwd
  q_start = pl.program_id(2) * b
  q, do = q_ref[...], do_ref[...]
  stats = max_ref[...], log_sum_ref[...], delta_ref[...]

  def body(j, dq):
    cols = pl.ds(j * b, b)
    k = k_ref[cols, :]
    kept = keep_ref[:, cols] if keep_ref is not None else None
    _, ds = _probs_and_grad(
      spec, q, k, v_ref[cols, :], do, mask_ref[:, cols], *stats, kept, q_start, j * b
    )
    return dq + _dot(ds.astype(k.dtype), k, spec)

  dq = lax.fori_loop(0, k_ref.shape[0] // b, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * np.float32(spec.scale)).astype(dq_ref.dtype)
