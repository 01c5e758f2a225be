"""GELU, the erf form, whose backward pass keeps only its input.

jax.nn.gelu(approximate=False) differentiated by JAX keeps, for the backward pass, the arrays its
derivative is made of (its erfc and exp terms and a product, each the size of the input) beside
the input. XLA fuses some of them away, not all: in bert_base's fp32 step compiled for the H200
each encoder layer held three [batch, 128, 3072] arrays at the peak, the FFN's product, the GELU's
output and one of those terms, where PyTorch's GeluBackward keeps its input alone and recomputes
the rest. That third array was 17% of the step's memory per sequence.

`gelu` computes the same values as jax.nn.gelu(x, approximate=False) and keeps only x: its
backward pass recomputes the derivative, Phi(x) + x phi(x), in float32 from x inside the fusion
that reads the incoming gradient. Its gradient is the autodiff one up to rounding
(tests/models/test_gelu.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_SQRT_HALF = np.float32(np.sqrt(0.5))
_INV_SQRT_2PI = np.float32(1.0 / np.sqrt(2.0 * np.pi))


@jax.custom_vjp
def gelu(x: jax.Array) -> jax.Array:
  """x Phi(x): jax.nn.gelu(x, approximate=False), the same values in x's dtype."""
  return jax.nn.gelu(x, approximate=False)


def _forward(x):
  return gelu(x), x


def _backward(x, g):
  # Behind the barrier XLA cannot see that this erfc is the forward's and merge the two, which
  # would keep the forward's erfc array for the backward pass after all.
  xf = lax.optimization_barrier(x).astype(jnp.float32)
  cdf = 0.5 * lax.erfc(-xf * _SQRT_HALF)
  pdf = jnp.exp(-0.5 * xf * xf) * _INV_SQRT_2PI
  return ((g.astype(jnp.float32) * (cdf + xf * pdf)).astype(g.dtype),)


gelu.defvjp(_forward, _backward)
