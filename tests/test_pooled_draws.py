"""The initial state's draws pooled (jaxbench.core.pooled_draws): the same shapes and
distributions from a few large draws, every array its own slice, and every draw that cannot be
pooled made as the init asked."""

import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jax_core

from jaxbench.core import pooled_draws
from jaxbench.core import program as prog
from models import precision, registry

# Variance scaling's truncated normal: N(0, 1) cut at +-2, scaled to the target deviation.
TRUNCATED_STD = 0.87962566103423978


def _bound(fan_in: int) -> float:
  return 2 * np.sqrt(1 / fan_in) / TRUNCATED_STD + 1e-6


def _bit_draws(fn, *args) -> int:
  """How many random-bit draws the traced program makes (its sub-programs' included)."""

  def count(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
      n += eqn.primitive.name in ('random_bits', 'threefry2x32')
      for sub in jax_core.jaxprs_in_params(eqn.params):
        n += count(sub)
    return n

  return count(jax.make_jaxpr(fn)(*args).jaxpr)


class Net(nn.Module):
  """Layers whose initializers draw truncated normals (lecun_normal is variance scaling),
  normals and uniforms, and one uniform with array bounds, which cannot be pooled."""

  @nn.compact
  def __call__(self, x):
    for width in (16, 16, 8):
      x = nn.Dense(width, kernel_init=nn.initializers.lecun_normal())(x)
    x = x + self.param('offset', nn.initializers.normal(0.5), (8,))
    x = x * self.param('gain', nn.initializers.uniform(3.0), (8, 4)).sum(-1)
    bounds = lambda key, shape: jax.random.uniform(key, shape, minval=jnp.zeros(shape))
    return x + self.param('bounded', bounds, (8,))


def _init(rng):
  return Net().init(rng, jnp.ones((1, 4)))['params']


def test_the_pooled_init_makes_the_same_arrays_from_a_few_draws():
  rng = jax.random.key(0)
  plain, pooled = _init(rng), pooled_draws.pooled(_init)(rng)
  assert jax.tree.structure(plain) == jax.tree.structure(pooled)
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(pooled)):
    assert a.shape == b.shape and a.dtype == b.dtype
  # Three kernels' truncated normals, a normal and a uniform: three pools, and the bounded
  # uniform drawn as asked (its array bounds cannot be pooled).
  assert _bit_draws(_init, rng) == 6 and _bit_draws(pooled_draws.pooled(_init), rng) == 4
  np.testing.assert_array_equal(plain['bounded'], pooled['bounded'])


def test_pooled_arrays_keep_their_distributions_and_are_their_own():
  params = pooled_draws.pooled(_init)(jax.random.key(1))
  for i, fan_in in enumerate((4, 16, 16)):
    k = np.asarray(params[f'Dense_{i}']['kernel'])
    assert np.abs(k).max() <= _bound(fan_in)  # truncated at two standard deviations
    assert 0.7 < k.std() / np.sqrt(1 / fan_in) < 1.3
  assert np.all(np.abs(params['gain']) <= 3.0) and np.all(params['gain'] >= 0)
  flat = [np.asarray(x).ravel() for x in jax.tree.leaves(params)]
  prefixes = {tuple(np.round(x[:4], 6)) for x in flat if x.size >= 4 and np.any(x)}
  assert len(prefixes) == len([x for x in flat if x.size >= 4 and np.any(x)])  # no shared slice


def test_the_pooled_init_is_deterministic_in_its_key():
  init = pooled_draws.pooled(_init)
  a, b, c = init(jax.random.key(2)), init(jax.random.key(2)), init(jax.random.key(3))
  for x, y, z in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(c)):
    np.testing.assert_array_equal(x, y)
    if np.any(x):
      assert not np.array_equal(x, z)


def test_draws_inside_a_vmap_or_a_scan_stay_one_per_element():
  """A call inside vmap or scan stands for a draw per element or step: pooling it would give
  every one the same slice (mask_rcnn's synthetic images are drawn in a vmap in its init)."""

  def init(rng):
    keys = jax.random.split(rng, 3)
    batched = jax.vmap(lambda k: jax.random.normal(k, (5,)))(keys)
    _, scanned = jax.lax.scan(lambda c, k: (c, jax.random.uniform(k, (5,))), 0, keys)
    return batched, scanned, jax.random.normal(rng, (5,))

  batched, scanned, single = jax.jit(pooled_draws.pooled(init))(jax.random.key(4))
  plain = init(jax.random.key(4))
  for drawn, want in ((batched, plain[0]), (scanned, plain[1])):
    assert not np.allclose(drawn[0], drawn[1]) and not np.allclose(drawn[1], drawn[2])
    np.testing.assert_array_equal(drawn, want)
  assert single.shape == (5,)


def test_a_group_larger_than_a_pool_fills_several(monkeypatch):
  monkeypatch.setattr(pooled_draws, 'POOL_ELEMENTS', 300)
  rng = jax.random.key(5)
  init = pooled_draws.pooled(_init)
  params = init(rng)
  assert _bit_draws(init, rng) > 4  # the kernels' 64 + 256 + 128 elements need two pools
  k = [np.asarray(params[f'Dense_{i}']['kernel']) for i in range(3)]
  assert all(np.abs(x).max() <= _bound(f) for x, f in zip(k, (4, 16, 16)))
  assert len({tuple(np.round(x.ravel()[:4], 6)) for x in k}) == 3


def test_an_init_that_draws_differently_when_traced_again_is_refused():
  calls = []

  def init(rng):
    calls.append(None)
    return jax.random.normal(rng, (len(calls),))

  with pytest.raises(RuntimeError, match='drew differently'):
    pooled_draws.pooled(init)(jax.random.key(6))


@pytest.mark.parametrize('name', ['bert_base', 'nasnet_large'])
def test_a_workloads_state_has_its_shapes_from_far_fewer_draws(name):
  w = registry.get(name)
  trainer = w.trainer(w.resolve(tiny=True), precision.get('fp32'))
  rng = jax.random.key(0)
  pooled = pooled_draws.pooled(trainer.init)
  assert jax.eval_shape(pooled, rng) == jax.eval_shape(trainer.init, rng)
  assert 2 * _bit_draws(pooled, rng) < _bit_draws(trainer.init, rng)


def _program():
  w = registry.get('transformer_big')
  return prog.Program(w, w.resolve(tiny=True), precision.get('fp32'))


def test_a_program_whose_pooled_draws_do_not_fit_draws_array_by_array():
  """Under a small memory cap the pools' temporaries may not fit beside the state: the state is
  then drawn per array, whose temporaries are smaller, and the record says so (init_pooled)."""
  p = _program()
  pooled = p.initial_state()
  assert p.init_pooled
  real = p._init_executable

  def out_of_memory(*args):
    raise RuntimeError('RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.9GiB.')

  p._init_executable = out_of_memory
  per_array = p.initial_state()
  assert not p.init_pooled and p._init_executable is not real
  assert jax.tree.map(jnp.shape, per_array) == jax.tree.map(jnp.shape, pooled)
  plain = jax.jit(p.trainer.init)(p.rng)
  for a, b in zip(jax.tree.leaves(per_array), jax.tree.leaves(plain)):
    np.testing.assert_array_equal(a, b)
  p._init_executable = out_of_memory  # per array already: an OOM now is the state's own
  with pytest.raises(RuntimeError, match='RESOURCE_EXHAUSTED'):
    p.initial_state()


def test_other_failures_of_the_pooled_init_are_not_retried():
  p = _program()
  p.initial_state()

  def broken(*args):
    raise ValueError('INTERNAL: something else')

  p._init_executable = broken
  with pytest.raises(ValueError, match='something else'):
    p.initial_state()
  assert p.init_pooled


def test_the_init_benchmark_compiles_both_forms_and_gives_their_ratio():
  from jaxbench import init_benchmark  # pylint: disable=g-import-not-at-top

  table = init_benchmark.rows(['bert_base'], None, True, None, rounds=1)
  assert [r[:2] for r in table] == [
    ('bert_base', 'per array'),
    ('bert_base', 'pooled'),
    ('bert_base', 'per array / pooled'),
  ]
  per_array, pooled, ratio = table
  assert pooled[4] < per_array[4]  # fewer fusions
  assert float(ratio[3].rstrip('x')) > 0


@pytest.mark.parametrize(
  'args, message',
  [
    (['--models=bert_base,nope'], 'unknown nope'),
    (['--rounds=0'], 'not a positive integer'),
    (['--compile_for=a100'], 'unknown target'),
  ],
)
def test_the_init_benchmark_refuses_bad_input_in_one_line(args, message):
  r = subprocess.run(
    [sys.executable, '-m', 'jaxbench.init_benchmark', *args], capture_output=True, text=True
  )
  assert r.returncode == 2 and r.stdout == ''
  assert r.stderr.count('\n') == 1 and message in r.stderr, r.stderr
