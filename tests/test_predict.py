"""Prediction arithmetic: the compile-only search under each card's cap, compiles shared."""

from jaxbench import catalog, predict, search
from tests.test_search import FakeProgram


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
  assert r.max_examples == 0 and r.trials[0].outcome == search.OOM_PREDICTED


def test_memo_replays_compile_errors_without_compiling_again():
  p = FakeProgram(error_at=1)
  memo = predict.PeakMemo(p)
  for _ in range(2):
    r = search.find_max_batch(memo, 10**6, run_steps=0)
    assert r.error is not None and 'shape mismatch' in r.error
  assert p.compiled == [1]
