"""jax.random's bits computed where JAX's own draw cannot run: inside a kernel, one element at a
time (models/layers/fused_attention.py draws its dropout decisions so).

Threefry-2x32 (Salmon et al. 2011, 20 rounds) is the hash under jax.random's default generator:
with partitionable threefry, an element's bits are the hash of its flat index under the key, so
any element can be drawn alone, in any order, and agree with a draw of the whole array.
"""

import jax.numpy as jnp
import numpy as np
from jax import lax

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


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
