"""The dropout draw (models/layers/dropout.py): the grouped decisions, the layer, and the
workloads' `dropout_draw` key."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import precision, registry
from models.layers import dropout, threefry_bits


def test_grouped_mask_hashes_a_counter_per_four_elements_and_decides_by_quarters():
  """Element 4 g + q of row r of a [.., L] array flattened to rows (G = ceil(L / 4)) is quarter q
  of the hash of the counter r * G + g under the threefry key's own words; a length not a
  multiple of 4 is cut."""
  key = jax.random.key(3)
  keep = threefry_bits.grouped_keep(0.7)
  got = np.asarray(dropout.grouped_keep_mask(key, (2, 3, 10), keep)).reshape(6, 10)
  k0, k1 = jax.random.key_data(key)
  counter = np.arange(18, dtype=np.uint32).reshape(6, 3)
  x0, x1 = (np.asarray(x) for x in threefry_bits.threefry2x32(k0, k1, 0 * counter, counter))
  quarters = np.stack([x0 & 0xFFFF, x0 >> 16, x1 & 0xFFFF, x1 >> 16], axis=-1).reshape(6, 12)
  np.testing.assert_array_equal(got, (quarters < round(0.7 * 2**16))[:, :10])


def test_another_prng_draws_the_hash_key_from_its_key():
  key = jax.random.key(3, impl='rbg')
  keep = threefry_bits.grouped_keep(0.5)
  got = np.asarray(dropout.grouped_keep_mask(key, (64, 64), keep))
  assert abs(got.mean() - keep) < 0.05
  np.testing.assert_array_equal(got, dropout.grouped_keep_mask(key, (64, 64), keep))


def test_grouped_dropout_is_unbiased_and_keeps_at_its_rate():
  """2**20 ones: each output is 0 or 1 / keep, the mean is 1 and the share kept is keep within
  five standard deviations, and neighbours and elements of one hash are independent."""
  rate = 0.1
  keep = threefry_bits.grouped_keep(1 - rate)
  y = np.asarray(dropout.drop_grouped(jnp.ones((256, 4096)), jax.random.key(5), rate))
  kept = y != 0
  np.testing.assert_allclose(y[kept], np.float32(1) / np.float32(keep))
  sd = np.sqrt(keep * (1 - keep) / kept.size)
  assert abs(kept.mean() - keep) < 5 * sd
  assert abs(y.mean() - 1) < 5 * sd / keep
  for offset in (1, 2, 3, 4, 5):
    both = (kept[:, :-offset] & kept[:, offset:]).mean()
    assert abs(both - keep**2) < 5 * np.sqrt(keep**2 * (1 - keep**2) / kept[:, offset:].size)


def test_a_different_key_draws_a_different_mask_and_the_same_key_the_same():
  keep = threefry_bits.grouped_keep(0.5)
  a, b, c = (
    np.asarray(dropout.grouped_keep_mask(jax.random.key(k), (64, 64), keep)) for k in (1, 1, 2)
  )
  np.testing.assert_array_equal(a, b)
  assert (a != c).mean() > 0.4


@pytest.mark.parametrize('draw', dropout.DRAWS)
def test_the_layer_passes_through_when_deterministic_or_at_rate_0(draw):
  x = jnp.arange(24.0).reshape(2, 12)
  rngs = {'dropout': jax.random.key(0)}
  for rate, deterministic in ((0.3, True), (0.0, False)):
    y = dropout.layer(rate, draw).apply({}, x, deterministic, rngs=rngs)
    np.testing.assert_array_equal(y, x)
  zeros = dropout.layer(1.0, draw).apply({}, x, False, rngs=rngs)
  np.testing.assert_array_equal(zeros, np.zeros_like(x))


def test_bernoulli_is_flax_own_dropout_and_an_unknown_draw_is_refused():
  assert isinstance(dropout.layer(0.1, 'bernoulli'), nn.Dropout)
  with pytest.raises(ValueError, match='bernoulli, grouped'):
    dropout.layer(0.1, 'philox')


def test_the_workloads_that_take_the_key_and_those_that_do_not():
  for name in ('bert_base', 'bert_squad', 'mt_dnn', 'transformer_big'):
    w = registry.get(name)
    assert w.resolve()['dropout_draw'] == 'grouped', name
    assert w.resolve(overrides={'dropout_draw': 'bernoulli'})['dropout_draw'] == 'bernoulli'
  with pytest.raises(ValueError, match="bert_base: dropout_draw must be one of bernoulli, grouped"):
    registry.get('bert_base').resolve(overrides={'dropout_draw': 'philox'})
  with pytest.raises(ValueError, match="yolov3 has no config key 'dropout_draw'"):
    registry.get('yolov3').resolve(overrides={'dropout_draw': 'grouped'})


def _hashes(jaxpr) -> int:
  """Threefry hashes a program asks for, counted in its jaxpr and every jaxpr inside it: one per
  element of jax.random's bits (partitionable threefry hashes each element's index once) and of a
  raw threefry2x32, and one per 20 elements of a 32-bit shift_left (threefry_bits' hash rotates
  20 times, a shift_left each; the step has no other)."""
  total = 0
  for eqn in jaxpr.eqns:
    size = int(np.prod(eqn.outvars[0].aval.shape)) if eqn.outvars else 0
    if eqn.primitive.name in ('random_bits', 'threefry2x32'):
      total += size
    elif eqn.primitive.name == 'shift_left' and eqn.outvars[0].aval.dtype == np.uint32:
      total += size / 20
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else (param,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          total += _hashes(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          total += _hashes(sub)
  return round(total)


def test_the_grouped_draw_makes_a_quarter_of_the_hashes_in_a_bert_step():
  """bert_base's tiny step at 2 sequences hashes each of its 9,216 dropout decisions once under
  'bernoulli': the dropout layers' 5 masks of [2, 16, 32] and the attention's 2 of [2, 4, 16, 16].
  Under 'grouped' the layers' take a quarter of their hashes, and the attention's (its saved
  form's draw) stay; its loss is finite either way."""
  w = registry.get('bert_base')
  counts = {}
  for draw in dropout.DRAWS:
    t = w.trainer(w.resolve(True, {'dropout_draw': draw}), precision.get('fp32'))
    state = t.init(jax.random.key(0))
    batch = t.make_batch(jax.random.key(1), 2)
    counts[draw] = _hashes(jax.make_jaxpr(t.step)(state, batch, jax.random.key(2)).jaxpr)
    _, metrics = jax.jit(t.step)(state, batch, jax.random.key(2))
    assert np.isfinite(float(metrics['loss'])), draw
  assert counts == {'bernoulli': 9_216, 'grouped': 5 * 1024 // 4 + 2 * 2048}, counts
