"""Parameter initializers that sample with XLA's RngBitGenerator instead of threefry.

Each threefry draw is a large unrolled hash that XLA compiles separately; a model with
hundreds of convolution kernels spends most of its init compile there (4x longer on CPU
for Darknet-53). The distributions are unchanged; only the bit generator differs. On a GPU,
where threefry is lowered to one kernel per draw while the initial state is built, they keep
threefry (see `rbg`).
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


# The platform the initial state is built for where it is not this process's backend: a GPU's
# program compiled on a host without one (python -m jaxbench.init_benchmark --compile_for).
BUILD_PLATFORM: str | None = None


def rbg(base: Initializer) -> Initializer:
  """`base` drawing its randomness from the RBG generator, except where threefry is one kernel.

  On a GPU the initial state is built with threefry lowered to a CUDA kernel per draw
  (jaxbench.core.program.threefry_as_kernels), and there RngBitGenerator is the larger program:
  XLA expands it into the hash's arithmetic for each draw (deeplabv3's initialization compiled
  for an H200 in 51 s with it, 11 s with threefry kernels; yolov3's 13 s, 2 s).
  """

  def init(key, shape, dtype=jnp.float32):
    platform = BUILD_PLATFORM or jax.default_backend()
    if jax.config.jax_threefry_gpu_kernel_lowering and platform == 'gpu':
      return base(key, shape, dtype)
    return base(rbg_key(key), shape, dtype)

  return init
