"""Dropout with a choice of how its keep decisions are drawn (the `dropout_draw` config key).

'bernoulli' is Flax's nn.Dropout: jax.random.bernoulli, whose default (partitionable threefry)
generator hashes each element's flat index once, 64 bits made for one decision. 'grouped' makes
four decisions of each hash, 16 bits each (the quarters threefry_bits.keep_mask_grouped takes in
the fused attention kernels): a quarter of the hashes, at a keep probability rounded to the nearest
multiple of 2**-16 (0.9 -> 0.89999390), by which the kept values are scaled, so the layer stays
unbiased. The layers that take the key are the dropouts on hidden states; the attention's
probabilities are drawn as their attention form draws them (models/layers/attention.py).
'grouped' is the default of bert_base, bert_squad, mt_dnn and transformer_big, whose steps ran
2-5% faster with it on an H100. What each draw compiles to and what it gains: docs/performance.md,
"Dropout's draw".
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from models.layers import threefry_bits

DRAWS = ('bernoulli', 'grouped')


def _hash_key(key):
  """The two words threefry_bits' hash takes as its key: a threefry key's own, or two drawn from a
  key of another PRNG implementation."""
  data = jax.random.key_data(key)
  if data.shape == (2,):
    return data[0], data[1]
  k0, k1 = jax.random.bits(key, (2,), jnp.uint32)
  return k0, k1


def grouped_keep_mask(key, shape: tuple[int, ...], keep: float):
  """Keep decisions of an array of `shape`, four a hash. A row of length L has G = ceil(L / 4)
  counters, numbered across the rows of the array flattened to [rows, L] (r * G + g); element
  4 g + q of row r is quarter q of counter r * G + g's hash (x0's low and high 16 bits, then
  x1's: threefry_bits.grouped_hash) below keep * 2**16. `keep` must be
  threefry_bits.grouped_keep's.

  XLA makes each element of a fusion's output in a thread of its own, so a hash whose four
  decisions were four elements of one output would be computed four times, or its 64 bits
  written to memory and read back. Here one fusion hashes each counter once and packs its four
  decisions in the low bits of a byte, and the fusions that use them unpack the byte: the step
  keeps a byte for four decisions, where jax.random.bernoulli's masks keep one for each. One
  counter, not a row's and a column's: XLA would hoist the hash's first steps on a column counter
  out of the rows, in kernels of their own."""
  k0, k1 = _hash_key(key)
  counter = threefry_bits.flat_counters(shape, threefry_bits.GROUP)
  quarters, level = threefry_bits.grouped_hash(k0, k1, jnp.zeros_like(counter), counter, keep)
  packed = sum((q < level).astype(jnp.uint8) << jnp.uint8(i) for i, q in enumerate(quarters))
  which = lax.broadcasted_iota(jnp.uint8, (*[1] * len(shape), threefry_bits.GROUP), len(shape))
  decided = (packed[..., None] >> which) & jnp.uint8(1) == 1
  return decided.reshape(*shape[:-1], -1)[..., : shape[-1]]


def drop_grouped(x, key, rate: float):
  """x with each element dropped at `rate`, four decisions a hash, and the rest scaled by the
  keep probability those decisions keep with."""
  keep = threefry_bits.grouped_keep(1.0 - rate)
  mask = grouped_keep_mask(key, x.shape, keep)
  return lax.select(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros_like(x))


class GroupedDropout(nn.Module):
  """nn.Dropout's interface with the grouped draw."""

  rate: float
  deterministic: bool | None = None

  @nn.compact
  def __call__(self, x, deterministic: bool | None = None):
    deterministic = nn.merge_param('deterministic', self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return x
    if self.rate == 1.0:
      return jnp.zeros_like(x)
    return drop_grouped(x, self.make_rng('dropout'), self.rate)


def layer(rate: float, draw: str = 'bernoulli', deterministic: bool | None = None) -> Any:
  """A dropout module for `draw`: Flax's own nn.Dropout for 'bernoulli' (so that a model built
  with it is the program it was before the choice existed), GroupedDropout for 'grouped'."""
  if draw == 'bernoulli':
    return nn.Dropout(rate, deterministic=deterministic)
  if draw == 'grouped':
    return GroupedDropout(rate, deterministic=deterministic)
  raise ValueError(f'dropout draw must be one of {", ".join(DRAWS)}, got {draw!r}')
