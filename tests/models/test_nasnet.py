"""NASNet-A Large: full-size parameter and FLOP counts, drop-path only in training."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import precision
from models import workload as wl
from models.nasnet import cells, nasnet

# Keras' NASNetLarge (slim's weights, 1000 classes): 88,753,150 trainable plus
# 196,668 batch-norm moving statistics = 88,949,818. At 1001 classes the final
# dense layer has 4032 + 1 more parameters.
KERAS_TRAINABLE_1000 = 88_753_150
BN_MOVING_STATS = 196_668
PAPER_MULT_ADDS = 23.8e9  # NASNet-A (6@4032) at 331x331, Zoph et al. 2018, Table 2


@pytest.mark.slow
def test_full_size_parameter_count():
  w = nasnet.NASNET_LARGE
  trainer = w.trainer(w.resolve(), precision.get('fp32'))
  shapes = jax.eval_shape(trainer.init, jax.random.key(0))
  trainable = wl.count_params(shapes.params)
  assert trainable == KERAS_TRAINABLE_1000 + 4032 + 1
  assert wl.count_params(shapes.model_state['batch_stats']) == BN_MOVING_STATS


@pytest.mark.slow
def test_full_size_flops_match_the_paper():
  mult_adds = nasnet.flops_per_example(nasnet.NASNET_LARGE.config) / 3 / 2
  assert abs(mult_adds - PAPER_MULT_ADDS) / PAPER_MULT_ADDS < 0.01, mult_adds


def _cell_inputs():
  x = jax.random.normal(jax.random.key(0), (8, 8, 8, 16))
  prev = jax.random.normal(jax.random.key(1), (8, 8, 8, 24))
  return x, prev


@functools.cache
def _cell_variables():
  x, prev = _cell_inputs()
  cell = cells.Cell(cells.REDUCTION, 16, 2, 1.0)
  return jax.jit(lambda k: cell.init(k, x, prev, False))(jax.random.key(2))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _apply_cell(variables, keep_prob, train, rng, progress):
  x, prev = _cell_inputs()
  cell = cells.Cell(cells.REDUCTION, 16, 2, keep_prob)
  out, _ = cell.apply(
    variables, x, prev, train, progress, rngs={'dropout': rng}, mutable=['batch_stats']
  )
  return out


def _cell_outputs(keep_prob, train, rng, progress=1.0):
  """A reduction cell (8 drop-path branches) on a batch of 8, at fixed parameters."""
  return np.asarray(_apply_cell(_cell_variables(), keep_prob, train, rng, progress))


def test_drop_path_is_off_at_evaluation():
  no_drop = _cell_outputs(1.0, False, jax.random.key(3))
  for seed in (3, 4):
    np.testing.assert_array_equal(_cell_outputs(0.5, False, jax.random.key(seed)), no_drop)


def test_drop_path_acts_in_training_and_follows_the_schedule():
  no_drop = _cell_outputs(1.0, True, jax.random.key(3))
  dropped = _cell_outputs(0.5, True, jax.random.key(3))
  assert not np.allclose(dropped, no_drop)
  # At the schedule's start (progress 0) the keep probability is still 1.
  np.testing.assert_allclose(
    _cell_outputs(0.5, True, jax.random.key(3), progress=0.0), no_drop, rtol=1e-6, atol=1e-6
  )


def test_factorized_reduction_samples_both_pixel_grids():
  x = jnp.arange(5 * 5, dtype=jnp.float32).reshape(1, 5, 5, 1)
  fr = cells.FactorizedReduction(2)
  variables = fr.init(jax.random.key(0), x, False)
  # Identity 1x1 convolutions; batch norm at its initial statistics (mean 0, var 1).
  params = dict(variables['params'])
  for path in ('path1_conv', 'path2_conv'):
    params[path] = {'kernel': jnp.ones((1, 1, 1, 1))}
  out = fr.apply({'params': params, 'batch_stats': variables['batch_stats']}, x, False)
  even = [[0, 2, 4], [10, 12, 14], [20, 22, 24]]  # TF's strided 1x1 average pool: ceil(5/2)
  odd = [[6, 8, 0], [16, 18, 0], [0, 0, 0]]  # shifted by one, zero-padded bottom and right
  expected = np.stack([even, odd], axis=-1)[None] / np.sqrt(1 + cells.BN_EPS)
  np.testing.assert_allclose(out, expected, rtol=1e-6)
