"""models.layers.gelu: jax.nn.gelu's values, its gradient, and only its input kept for the
backward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.layers import gelu


def _exact(x):
  return jax.nn.gelu(x, approximate=False)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16, jnp.float16])
def test_values_are_jax_nn_gelus(dtype):
  x = (4 * jax.random.normal(jax.random.key(0), (4096,))).astype(dtype)
  out = gelu.gelu(x)
  assert out.dtype == dtype
  np.testing.assert_array_equal(out, _exact(x))


def test_gradient_is_autodiffs_in_float32_and_within_rounding_in_16_bit():
  x = 4 * jax.random.normal(jax.random.key(1), (4096,))
  g = jax.random.normal(jax.random.key(2), (4096,))
  vjp = lambda f, x, g: jax.vjp(f, x)[1](g)[0]
  np.testing.assert_allclose(vjp(gelu.gelu, x, g), vjp(_exact, x, g), rtol=1e-5, atol=1e-6)
  # In bf16 ours computes the derivative in float32 and rounds once: as close to the float32
  # gradient as autodiff's bf16 arithmetic, or closer.
  to32 = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
  exact = vjp(_exact, to32(x), to32(g))
  ours = vjp(gelu.gelu, x.astype(jnp.bfloat16), g.astype(jnp.bfloat16))
  autodiff = vjp(_exact, x.astype(jnp.bfloat16), g.astype(jnp.bfloat16))
  assert ours.dtype == jnp.bfloat16
  ours_error = np.abs(ours.astype(np.float32) - exact).max()
  assert ours_error <= np.abs(autodiff.astype(np.float32) - exact).max()
  assert jnp.all(jnp.isfinite(jax.grad(lambda x: gelu.gelu(x).sum())(jnp.array([-1e4, 0, 1e4]))))


def _temporaries(activation) -> int:
  """The temporaries of dense -> activation -> dense's gradient, compiled for this CPU."""

  def loss(x, w1, w2):
    return jnp.sum(activation(x @ w1) @ w2)

  shapes = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((512, 64), (64, 256), (256, 64))]
  compiled = jax.jit(jax.grad(loss, argnums=(1, 2))).lower(*shapes).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_the_backward_pass_keeps_less_than_autodiffs():
  # Autodiff keeps terms of the derivative beside the input; ours keeps the input and the
  # activation the second product needs. Without the barrier in its backward pass, XLA merges
  # the recomputed erfc with the forward's and keeps it after all (the same temporaries).
  hidden = 512 * 256 * 4  # one [512, 256] float32 array
  assert _temporaries(gelu.gelu) <= _temporaries(_exact) - 2 * hidden
