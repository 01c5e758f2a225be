"""models/layers/rbg_init: RBG's bits on a CPU, whatever the threefry lowering."""

import flax.linen as nn
import jax
import numpy as np

from jaxbench.core import program
from models.layers import rbg_init


def test_rbg_initializers_keep_rbg_on_a_cpu_inside_threefry_as_kernels():
  base = nn.initializers.normal(1.0)
  key = jax.random.key(3)
  outside = jax.jit(lambda k: rbg_init.rbg(base)(k, (64,)))(key)
  with program.threefry_as_kernels():
    inside = jax.jit(lambda k: rbg_init.rbg(base)(k, (64,)))(key)
  np.testing.assert_array_equal(outside, inside)
  assert not np.allclose(outside, base(key, (64,)))  # RBG's bits, not threefry's
  assert abs(float(np.std(outside)) - 1.0) < 0.3  # the same distribution
