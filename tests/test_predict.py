"""Prediction arithmetic: the compile-only search under each card's cap, compiles shared."""

import jax
import pytest

from jaxbench.cards import catalog, predict
from jaxbench.core import hints, probe, search
from tests.test_search import FakeProgram

# FakeProgram holds no arrays (tests/conftest.py).
pytestmark = pytest.mark.usefixtures('no_collection_after_a_failed_trial')


def test_compile_only_search_finds_the_cap_boundary_and_runs_nothing():
  gib = 2**30
  p = FakeProgram(a=2 * gib, b=50 * 2**20)  # 2 GiB of state, 50 MiB per example
  memo = predict.PeakMemo(p)
  found = {}
  for gpu in sorted(catalog.lambda2020(), key=lambda g: g.cap_bytes):
    r = search.find_max_batch(memo, gpu.cap_bytes, run_steps=0)
    found[gpu.name] = r.max_examples
    assert r.error is None and all(t.run_s is None for t in r.trials)
  # cap = memory - 768 MiB; max n = (cap - a) // b
  expected = {g.name: (g.memory_gb * 1024 - 768 - 2048) // 50 for g in catalog.lambda2020()}
  assert found == expected
  assert found['rtx_2060'] == 66 and found['rtx_2080_ti'] == 168  # (6144 - 2816) // 50, ...
  assert p.ran == []  # nothing ran
  assert memo.compiles == len(p.compiled) == len(set(p.compiled))  # each batch compiled once


def test_a_card_too_small_for_one_example_is_oom():
  p = FakeProgram(a=7 * 2**30, b=1)
  r = search.find_max_batch(predict.PeakMemo(p), catalog.get('rtx_2060').cap_bytes, run_steps=0)
  assert r.max_examples == 0 and r.trials[0].outcome == probe.OOM_PREDICTED


def test_memo_replays_compile_errors_without_compiling_again():
  p = FakeProgram(error_at=1)
  memo = predict.PeakMemo(p)
  for _ in range(2):
    r = search.find_max_batch(memo, 10**6, run_steps=0)
    assert r.error is not None and 'shape mismatch' in r.error
  assert p.compiled == [1]


def test_earlier_forecasts_are_known_at_every_cap_and_save_their_compiles():
  gib = 2**30
  fresh = FakeProgram(a=2 * gib, b=50 * 2**20)
  cards = sorted(catalog.lambda2020(), key=lambda g: g.cap_bytes)
  memo = predict.PeakMemo(fresh)
  expected = {
    g.name: search.find_max_batch(memo, g.cap_bytes, run_steps=0).max_examples for g in cards
  }
  # An earlier process compiled the RTX 2060's boundary (66 fits, 67 does not) and one batch.
  earlier = {n: (fresh.peak(n), '2026-11-30T09:00:00') for n in (1, 66, 67)}
  again = FakeProgram(a=2 * gib, b=50 * 2**20)
  memo = predict.PeakMemo(again)
  for g in cards:
    known = hints.forecast_trials(earlier, g.cap_bytes, 1, 1 << 20)
    r = search.find_max_batch(memo, g.cap_bytes, run_steps=0, known=known)
    assert r.max_examples == expected[g.name], g.name
    if g.name == 'rtx_2060':
      assert [t.examples for t in r.trials] == [1, 66, 67]  # nothing left open: no compile
      assert all(t.earlier for t in r.trials)
  assert not {1, 66, 67} & set(again.compiled)
  assert len(again.compiled) < len(fresh.compiled)


def test_known_trials_stop_at_the_first_failure_and_at_the_cap():
  # Not monotone: 30 is over the cap, 40 under it again (a forecast's bump).
  earlier = {10: (100, 't'), 20: (200, 't'), 30: (900, 't'), 40: (300, 't')}
  known = hints.forecast_trials(earlier, 500, 2, 1 << 20)
  assert [(t.examples, t.batch, t.outcome) for t in known] == [
    (10, 20, probe.FITS),
    (20, 40, probe.FITS),
    (30, 60, probe.OOM_PREDICTED),
  ]
  assert '0.000 GB > budget' in known[-1].detail
  # A fit beyond --max_examples is left to the cap.
  assert [t.examples for t in hints.forecast_trials(earlier, 500, 1, 15)] == [10]


def test_each_compile_not_each_hit_releases_the_host_memory_errors_included(monkeypatch):
  released = []
  monkeypatch.setattr(predict.prog, 'release_host', lambda: released.append(1))
  memo = predict.PeakMemo(FakeProgram(error_at=3))
  memo.compile(1)
  memo.compile(1)  # a hit: nothing compiled, nothing to release
  with pytest.raises(RuntimeError, match='shape mismatch') as raised:
    memo.compile(3)
  assert raised.value.__context__ is None  # the compile's own error, traceback and all, is gone
  assert memo.compiles == 2 and len(released) == 2


@pytest.mark.releases
def test_release_host_drops_jax_s_traced_programs():
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from jaxbench.core import program  # pylint: disable=g-import-not-at-top

  traces = []

  @jax.jit
  def f(x):
    traces.append(1)
    return x + 1

  x = jnp.ones(3)
  f(x), f(x)
  assert len(traces) == 1  # cached
  program.release_host()
  f(x)
  assert len(traces) == 2  # traced again: the cache was dropped
