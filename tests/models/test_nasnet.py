"""NASNet-A Large: full-size parameter and FLOP counts, drop-path only in training."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import precision
from models import workload as wl
from models.nasnet import cells, nasnet

PAPER_MULT_ADDS = 23.8e9  # NASNet-A (6@4032) at 331x331, Zoph et al. 2018, Table 2

# slim's NASNet-A cells: the separable branches as (kernel, hidden state read), and how many
# hidden states the output concatenates. States 0 and 1 are the cell's inputs, 2 the first
# combination's sum. Pooling and identity branches add no weights in NASNet-A: each reads a
# state of the cell's width, and no identity is strided.
NORMAL = (((5, 0), (3, 1), (5, 1), (3, 1), (3, 0)), 6)
REDUCTION = (((5, 0), (7, 1), (7, 1), (5, 1), (3, 2)), 4)


def nasnet_a_cell(kind, c_in, c_prev, f):
  """A cell of `f` filters on an input of c_in channels and a previous output of c_prev: its
  weights, batch-norm channels and output width. A 1x1 brings the input to f; the previous
  output comes to f through a 1x1, or a factorized reduction's two 1x1s to f/2 (the same count).
  Without a previous cell (the first stem cell) slim passes the raw input on as state 1.
  Each separable branch runs twice: depthwise k x k, pointwise 1x1, batch norm."""
  separables, concatenated = kind
  weights, bn = c_in * f + (c_prev or 0) * f, f + (f if c_prev else 0)
  state1 = f if c_prev else c_in
  for k, state in separables:
    c = state1 if state == 1 else f
    weights += (k * k * c + c * f) + (k * k * f + f * f)
    bn += 2 * f
  return weights, bn, concatenated * f


def nasnet_a_large_parameters(classes=1001, cells=18, filters=168, stem=96):
  """NASNet-A Large as slim's nasnet.py builds it, without the auxiliary head: its weights
  (convolutions and the final dense layer) and its batch-norm channels.

  At classes=1000 these give Keras' NASNetLarge (slim's weights): 88,753,150 trainable
  (weights, gamma and beta) and 196,668 moving statistics (mean and variance). The 1001st class
  adds 4032 + 1 to the dense layer.
  """
  counts = [(3 * 3 * 3 * stem, stem)]  # conv0 (3x3, stride 2) and its batch norm
  outputs = [None, stem]  # each cell's output width

  def add(kind, f, prev):
    weights, bn, out = nasnet_a_cell(kind, outputs[-1], prev, f)
    counts.append((weights, bn))
    outputs.append(out)

  for f in (filters // 4, filters // 2):  # the two reduction stem cells
    add(REDUCTION, f, outputs[-2])
  f = filters
  for i in range(cells):
    prev = outputs[-2]  # skip_reduction_layer_input: the cell after a reduction skips it
    if i in (cells // 3, 2 * cells // 3):
      f *= 2
      add(REDUCTION, f, outputs[-2])
    add(NORMAL, f, prev)
  weights = sum(w for w, _ in counts) + outputs[-1] * classes + classes
  return weights, sum(b for _, b in counts)


def test_the_derivation_is_keras_nasnet_large_at_1000_classes():
  """The layer-by-layer count against a published one (Keras' NASNetLarge, slim's weights):
  88,753,150 trainable and 196,668 batch-norm moving statistics."""
  weights, bn_channels = nasnet_a_large_parameters(classes=1000)
  assert (weights + 2 * bn_channels, 2 * bn_channels) == (88_753_150, 196_668)


@pytest.mark.slow
def test_full_size_parameter_count():
  w = nasnet.NASNET_LARGE
  trainer = w.trainer(w.resolve(), precision.get('fp32'))
  shapes = jax.eval_shape(trainer.init, jax.random.key(0))
  weights, bn_channels = nasnet_a_large_parameters()
  # Batch norm: gamma and beta trained, mean and variance in batch_stats.
  assert wl.count_params(shapes.params) == weights + 2 * bn_channels  # 88,757,183
  assert wl.count_params(shapes.model_state['batch_stats']) == 2 * bn_channels  # 196,668


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
