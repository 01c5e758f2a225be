"""Random bits of jax.random's threefry generator computed where JAX's own draw cannot run:
inside a kernel, one element or one group of elements at a time (models/layers/fused_attention.py
draws its dropout decisions so).

Threefry-2x32 (Salmon et al. 2011, 20 rounds) is the hash under jax.random's default generator:
with partitionable threefry, an element's bits are the hash of its flat index under the key, so
any element can be drawn alone, in any order, and agree with a draw of the whole array
(`keep_mask`: jax.random.bernoulli's decisions, one hash each). A hash gives 64 bits and costs
about 80 integer instructions; `keep_mask_grouped` makes four decisions of one, 16 bits each, at
about a quarter of the arithmetic: the probability of keeping is then a multiple of 2**-16
(`grouped_keep`), which the caller scales by, so the dropout stays unbiased.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
GROUP = 4  # the decisions keep_mask_grouped makes of one hash
_LEVELS = 2**16  # a grouped decision's bits


def _rotl(x, d):
  return (x << np.uint32(d)) | (x >> np.uint32(32 - d))


def threefry2x32(k0, k1, x0, x1):
  """Threefry-2x32 of the counter (x0, x1) under the key (k0, k1); uint32 arrays."""
  ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x0 = x0 + x1
      x1 = _rotl(x1, r) ^ x0
    x0 = x0 + ks[(i + 1) % 3]
    x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x0, x1


def keep_mask(k0, k1, hi, lo, keep: float):
  """jax.random.bernoulli(key, keep) at the elements whose flat index is hi * 2**32 + lo."""
  x0, x1 = threefry2x32(k0, k1, hi, lo)
  bits = x0 ^ x1
  uniform = lax.bitcast_convert_type((bits >> np.uint32(9)) | np.uint32(0x3F800000), jnp.float32)
  return uniform - 1.0 < np.float32(keep)


def grouped_keep(keep: float) -> float:
  """The probability keep_mask_grouped keeps with when asked for `keep`: the nearest multiple
  of 2**-16 (0.9 -> 58,982 / 65,536 = 0.89999390), exact in float32."""
  return min(max(round(keep * _LEVELS), 0), _LEVELS) / _LEVELS


def grouped_hash(k0, k1, hi, lo, keep: float):
  """The four 16-bit quarters of each counter's hash, in decision order (x0's low and high half,
  then x1's), and the level below which a quarter keeps (keep * 2**16). `keep` must be
  grouped_keep's."""
  if grouped_keep(keep) != keep:
    raise ValueError(f'keep {keep} is not a multiple of 2**-16 (grouped_keep)')
  x0, x1 = threefry2x32(k0, k1, hi, lo)
  low, half = np.uint32(0xFFFF), np.uint32(16)
  return (x0 & low, x0 >> half, x1 & low, x1 >> half), np.uint32(round(keep * _LEVELS))


def keep_mask_grouped(k0, k1, hi, lo, keep: float):
  """Four keep decisions per counter: counters [..., G] give decisions [..., 4 G], those of
  counter g at 4 g to 4 g + 3 from the hash's quarters (grouped_hash). A decision keeps when its
  16 bits are below keep * 2**16. The quarters are interleaved by stacking on a last axis and
  merging it, which Triton lowers to its join and reshape."""
  (q0, q1, q2, q3), level = grouped_hash(k0, k1, hi, lo, keep)
  evens = jnp.stack([q0, q2], axis=-1)
  odds = jnp.stack([q1, q3], axis=-1)
  words = jnp.stack([evens, odds], axis=-1).reshape(*q0.shape[:-1], GROUP * q0.shape[-1])
  return words < level


def flat_counters(shape: tuple[int, ...], per_hash: int):
  """The counters of an array [..., L] drawn per_hash decisions a hash: ceil(L / per_hash) a row,
  numbered across the rows flattened, as uint32 [..., ceil(L / per_hash)] (computed, not a
  constant). Refuses an array whose counters a 32-bit word does not number."""
  *lead, length = shape
  rows, width = math.prod(lead), -(-length // per_hash)
  if rows * width >= 2**32:
    raise ValueError(f'{rows * width:,} counters: more than a 32-bit flat index holds')
  return lax.iota(jnp.uint32, rows * width).reshape(*lead, width)


def keep_mask_array(key, shape: tuple[int, ...], keep: float, per_hash: int):
  """The decisions of a whole [..., L] array as the kernels draw them: per_hash 1, one hash per
  element of the flat index (jax.random.bernoulli(key, keep, shape)); per_hash 4 (GROUP),
  keep_mask_grouped on each row's counters, ceil(L / 4) a row, numbered across rows. A reference
  for tests and benchmarks: its counters stay below 2**32 (the kernels carry into the high word)."""
  if per_hash not in (1, GROUP):
    raise ValueError(f'decisions per hash must be 1 or {GROUP}, got {per_hash}')
  k0, k1 = jax.random.key_data(key).astype(jnp.uint32)
  lo = flat_counters(shape, per_hash)
  draw = keep_mask if per_hash == 1 else keep_mask_grouped
  return draw(k0, k1, jnp.zeros_like(lo), lo, keep)[..., : shape[-1]]
