"""Parameter initializers that sample with XLA's RngBitGenerator instead of threefry.

Each threefry draw is a large unrolled hash that XLA compiles separately; a model with
hundreds of convolution kernels spends most of its init compile there (4x longer on CPU
for Darknet-53). The distributions are unchanged; only the bit generator differs.
"""

from typing import Any, Callable

import jax
import jax.numpy as jnp

Initializer = Callable[..., Any]
_GOLDEN = 0x9E3779B9  # any odd constant: widens the 2-word key to RBG's 4 words


def rbg_key(key: jax.Array) -> jax.Array:
  """An RBG key made from `key`'s data, without a threefry hash (also for synthetic batches)."""
  data = jax.random.key_data(key).reshape(-1)[:2]
  return jax.random.wrap_key_data(jnp.concatenate([data, data ^ jnp.uint32(_GOLDEN)]), impl='rbg')


def rbg(base: Initializer) -> Initializer:
  """`base` drawing its randomness from the RBG generator."""
  return lambda key, shape, dtype=jnp.float32: base(rbg_key(key), shape, dtype)
