"""take_rows: indexing's values, a gradient summed in float32, and RoIAlign built on it."""

import re

import jax
import jax.numpy as jnp
import numpy as np

from models.layers import gather
from models.mask_rcnn import detection_ops as ops


def _table_and_index(dtype):
  table = jax.random.normal(jax.random.key(0), (6, 3)).astype(dtype)
  # Row 2 is read by most taps: a contended row, where a 16-bit sum loses precision.
  index = jnp.asarray([[2, 2, 2, 2], [2, 5, 2, 0], [2, 2, 1, 2]] * 40)
  return table, index


def _scatters(f, table):
  """The element type each scatter-add of f's backward pass adds in (its StableHLO region)."""
  loss = lambda t: jnp.sum(f(t).astype(jnp.float32))
  text = jax.jit(jax.grad(loss)).lower(table).as_text()
  return re.findall(r'"stablehlo.scatter".*?\^bb0\(%\w+: tensor<(\w+)>', text, re.DOTALL)


def test_values_are_indexings():
  table, index = _table_and_index(jnp.bfloat16)
  np.testing.assert_array_equal(gather.take_rows(table, index), table[index])


def test_bf16_gradient_sums_in_float32_then_casts_once():
  table, index = _table_and_index(jnp.bfloat16)
  weights = jax.random.uniform(jax.random.key(1), (*index.shape, 3)).astype(jnp.bfloat16)

  def grad(take):
    return jax.grad(lambda t: jnp.sum((take(t, index) * weights).astype(jnp.float32)))(table)

  ours = grad(gather.take_rows)
  assert ours.dtype == jnp.bfloat16
  exact = np.zeros((6, 3), np.float64)
  np.add.at(exact, np.asarray(index), np.asarray(weights, np.float64))
  np.testing.assert_array_equal(ours, exact.astype(np.float32).astype(jnp.bfloat16))
  ours_error = np.abs(np.asarray(ours, np.float64) - exact).max()
  plain_error = np.abs(np.asarray(grad(lambda t, i: t[i]), np.float64) - exact).max()
  assert ours_error < plain_error  # 120 bf16 additions into row 2 drift


def test_scatter_adds_in_float32_under_bf16_and_float32_is_indexings_program():
  table, index = _table_and_index(jnp.bfloat16)
  assert _scatters(lambda t: t[index], table) == ['bf16']
  assert _scatters(lambda t: gather.take_rows(t, index), table) == ['f32']
  table32 = table.astype(jnp.float32)

  def program(take):
    loss = lambda t: jnp.sum(take(t, index))
    return jax.jit(jax.value_and_grad(loss)).lower(table32).as_text(debug_info=False)

  assert program(gather.take_rows) == program(lambda t, i: t[i])


def test_roi_align_gradient_into_a_bf16_pyramid_adds_in_float32():
  sizes = ((16, 16), (8, 8))
  features = [
    jax.random.normal(jax.random.key(i), (h, w, 4)).astype(jnp.bfloat16)
    for i, (h, w) in enumerate(sizes)
  ]
  boxes = jnp.asarray([[4.0, 4.0, 40.0, 36.0], [0.0, 8.0, 20.0, 60.0], [10.0, 2.0, 60.0, 30.0]])
  levels = jnp.asarray([0, 1, 0])

  def pooled(features):
    return ops.multilevel_roi_align(features, boxes, levels, (4, 8), 2, 2)

  types = _scatters(pooled, features)
  assert types and set(types) == {'f32'}
  assert pooled(features).dtype == jnp.bfloat16
