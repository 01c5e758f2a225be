"""models.layers.embed.Embed: nn.Embed's values, with the lookup's gradient kept in float32."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.layers import embed


def _pair(rows, dtype):
  ids = jax.random.randint(jax.random.key(1), (4, 16), 0, rows)
  ours = embed.Embed(rows, 8, dtype=dtype)
  flax = nn.Embed(rows, 8, dtype=dtype)
  params = ours.init(jax.random.key(0), ids)
  return ours, flax, params, ids


@pytest.mark.parametrize('rows', [2, embed.ONE_HOT_MAX + 1])  # one-hot, then gathered
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_values_and_gradient_equal_flax_embed(rows, dtype):
  ours, flax, params, ids = _pair(rows, dtype)
  out = ours.apply(params, ids)
  assert out.dtype == dtype
  np.testing.assert_array_equal(out, flax.apply(params, ids))  # a row read exactly, then cast

  def grad(module, p):
    weights = jax.random.normal(jax.random.key(2), (*ids.shape, 8))
    loss = lambda p: jnp.sum(module.apply(p, ids).astype(jnp.float32) * weights)
    return jax.grad(loss)(p)['params']['embedding']

  exact = grad(nn.Embed(rows, 8), params)  # float32 throughout
  if dtype == jnp.float32:  # the same sums, maybe in another order
    np.testing.assert_allclose(grad(ours, params), exact, rtol=1e-5, atol=1e-5)
  else:  # ours adds in float32, nn.Embed in bfloat16: ours is as close to exact, or closer
    ours_error = np.abs(grad(ours, params) - exact).max()
    assert ours_error <= np.abs(grad(flax, params) - exact).max()
    assert ours_error <= 2**-7 * np.abs(exact).max()


def _scatters(module, params, ids):
  """The element type each scatter-add of the backward pass adds in (its StableHLO region)."""
  loss = lambda p: jnp.sum(module.apply(p, ids).astype(jnp.float32))
  text = jax.jit(jax.grad(loss)).lower(params).as_text()
  return re.findall(r'"stablehlo.scatter".*?\^bb0\(%\w+: tensor<(\w+)>', text, re.DOTALL)


def test_bf16_gradient_scatters_into_float32_or_not_at_all():
  ours, flax, params, ids = _pair(embed.ONE_HOT_MAX + 1, jnp.bfloat16)
  assert _scatters(flax, params, ids) == ['bf16']  # what made BERT's bf16 step slow
  assert _scatters(ours, params, ids) == ['f32']
  ours, _, params, ids = _pair(2, jnp.bfloat16)
  assert _scatters(ours, params, ids) == []  # a matrix product instead


@pytest.mark.parametrize('rows', [2, embed.ONE_HOT_MAX + 1])
def test_a_float32_lookup_is_flax_embeds_program(rows):
  ours, flax, params, ids = _pair(rows, jnp.float32)

  def program(module):
    loss = lambda p: jnp.sum(module.apply(p, ids))
    return jax.jit(jax.value_and_grad(loss)).lower(params).as_text(debug_info=False)

  assert program(ours) == program(flax)


def test_attend_is_flax_embed_attend():
  ours, flax, params, _ = _pair(embed.ONE_HOT_MAX + 1, jnp.bfloat16)
  query = jax.random.normal(jax.random.key(3), (3, 8))
  np.testing.assert_array_equal(
    ours.apply(params, query, method='attend'), flax.apply(params, query, method='attend')
  )
