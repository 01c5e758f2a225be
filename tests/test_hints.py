"""Search hints: which earlier results may aim a search (the same program, compiler and device)."""

import json

from jaxbench.core import hints


def _record(**changes):
  r = {
    'schema': 'jaxbench.result/1',
    'workload': 'bert_base',
    'workload_revision': 2,
    'precision': 'fp32',
    'status': 'ok',
    'max_batch': 188,
    'tiny': False,
    'jax_version': '0.11.2',
    'xla_flags': '--xla_disable_hlo_passes=rematerialization',
    'config': {'seq_len': 128, 'dims': (768, 12)},
    'device': {'platform': 'gpu', 'kind': 'NVIDIA H200', 'pool_bytes': 23899144192},
    'search': {
      'trials': [
        {'examples': 1, 'predicted_peak_bytes': 1480},
        {'examples': 188, 'predicted_peak_bytes': 23906},
        {'examples': 5, 'predicted_peak_bytes': None},  # an OOM at compile time: no forecast
      ]
    },
  }
  r.update(changes)
  return r


def test_only_the_same_program_compiler_and_device_count(tmp_path):
  path = tmp_path / 'earlier.jsonl'
  others = [
    _record(precision='bf16'),
    _record(jax_version='0.10.2'),
    _record(xla_flags=''),  # rematerialization allowed: another program
    _record(config={'seq_len': 512, 'dims': (768, 12)}),
    _record(device={'platform': 'gpu', 'kind': 'NVIDIA A100'}),
    _record(workload='bert_squad'),
    _record(workload_revision=1),  # the model's program changed since
    _record(tiny=True),
    _record(prng_impl='unsafe_rbg'),  # other random bits in the step: another program
  ]
  lines = [json.dumps(r) for r in [_record(), *others]]
  path.write_text('\n'.join(lines) + '\n{"cut short')
  # The run asking differs only in its memory pool (another budget), which forecasts ignore.
  head = _record(device={'platform': 'gpu', 'kind': 'NVIDIA H200', 'pool_bytes': 142606336000})
  assert hints.load([str(path)], head) == ({1: 1480, 188: 23906}, 1, [])


def test_another_jaxs_forecasts_aim_only_where_this_ones_are_missing(tmp_path):
  """A compile-only prediction made with another JAX (a CPU's) aims a search on the GPU, and says
  so in the search's record; it never stands in for a compile (decided, forecasts)."""
  path = tmp_path / 'earlier.jsonl'
  older = _record(
    jax_version='0.10.2',
    device={'platform': 'gpu', 'kind': 'NVIDIA H200', 'pool_bytes': None, 'deviceless': True},
    search={'trials': [{'examples': 150, 'predicted_peak_bytes': 19000, 'outcome': 'fits'}]},
  )
  path.write_text(json.dumps(older) + '\n')
  head = _record(search={})
  peaks, matched, versions = hints.load([str(path)], head)
  assert (peaks, matched, versions) == ({150: 19000}, 1, ['0.10.2'])
  assert hints.summary([str(path)], matched, peaks, versions)['jax_versions'] == ['0.10.2']
  assert hints.decided([str(path)], head, 24 * 10**9) == []
  assert hints.forecasts([str(path)], {**head, 'device': older['device']}) == {}
  # With a result of this JAX's own, the other version's are not read.
  path.write_text(json.dumps(older) + '\n' + json.dumps(_record()) + '\n')
  assert hints.load([str(path)], head) == ({1: 1480, 188: 23906}, 1, [])
  assert 'jax_versions' not in hints.summary([str(path)], 1, {1: 1480}, [])
  # Another program under another JAX aims nothing.
  assert hints.load([str(path)], _record(precision='bf16'))[1] == 0


def test_a_record_without_a_prng_used_jaxs_default(tmp_path):
  path = tmp_path / 'earlier.jsonl'
  path.write_text(json.dumps(_record()) + '\n')
  assert hints.load([str(path)], _record(prng_impl='threefry2x32'))[1] == 1
  assert hints.load([str(path)], _record(prng_impl='rbg'))[1] == 0


def test_no_files_no_hints():
  assert hints.load([], _record()) == ({}, 0, [])


def test_results_from_before_revisions_count_as_revision_one(tmp_path):
  path = tmp_path / 'old.jsonl'
  old = _record()
  del old['workload_revision']
  path.write_text(json.dumps(old) + '\n')
  assert hints.load([str(path)], _record(workload_revision=1))[1] == 1
  assert hints.load([str(path)], _record(workload_revision=2))[1] == 0


def test_a_result_without_one_of_the_configs_keys_is_another_program(tmp_path):
  """A record from before a workload gained a config key does not aim its searches."""
  path = tmp_path / 'old.jsonl'
  path.write_text(json.dumps(_record(config={'seq_len': 128})) + '\n')
  assert hints.load([str(path)], _record())[1] == 0
  assert hints.load([str(path)], _record(config={'seq_len': 128}))[1] == 1


def test_a_cache_location_is_not_a_compiler_setting(tmp_path):
  """--autotune_cache_dir changes where autotuning results come from, and --autotune_log where
  they are written down, not what is compiled."""
  cached = (
    '--xla_disable_hlo_passes=rematerialization --xla_gpu_per_fusion_autotune_cache_dir=/c '
    '--xla_gpu_dump_autotune_logs_to=/tmp/at.txt'
  )
  path = tmp_path / 'earlier.jsonl'
  path.write_text(
    json.dumps(_record(xla_flags=cached))
    + '\n'
    + json.dumps(_record(xla_flags=cached + ' --xla_gpu_autotune_level=0'))  # another setting
    + '\n'
  )
  assert hints.load([str(path)], _record()) == ({1: 1480, 188: 23906}, 1, [])
  assert hints.compiler_flags(cached) == '--xla_disable_hlo_passes=rematerialization'


def _run(timestamp, trials, limit=None, pool=142606336000, **changes):
  return _record(
    timestamp=timestamp,
    memory={'limit_bytes': limit},
    device={'platform': 'gpu', 'kind': 'NVIDIA H200', 'pool_bytes': pool},
    search={'trials': trials},
    **changes,
  )


def _trial(n, outcome, peak):
  return {'examples': n, 'batch': n, 'outcome': outcome, 'predicted_peak_bytes': peak}


def test_resumed_trials_come_from_the_same_program_under_the_same_memory(tmp_path):
  path = tmp_path / 'earlier.jsonl'
  runs = [
    _run('t1', [_trial(359, 'fits', 359), _trial(362, 'oom_predicted', 362)]),
    _run('t2', [_trial(360, 'fits', 360), _trial(361, 'unfinished', 361)]),  # cut in its run
    _run('t3', [_trial(300, 'error', None)]),  # decides nothing
    _run('x', [_trial(100, 'fits', 100)], limit=24_000_000_000),  # another --memory_limit_gb
    _run('y', [_trial(101, 'fits', 101)], pool=141_000_000_000),  # another pool
    _run('z', [_trial(102, 'fits', 102)], precision='bf16'),  # another program
    # A compile-only prediction under the same memory: nothing of it ran.
    {**_run('p', []), 'search': {'mode': 'predict', 'trials': [_trial(400, 'oom_compile', None)]}},
  ]
  path.write_text(''.join(json.dumps(r) + '\n' for r in runs))
  head = _run('now', [])
  got = hints.decided([str(path)], head, budget=361)
  assert [(t.examples, t.outcome, t.earlier) for t in got] == [
    (359, 'fits', 't1'),
    (360, 'fits', 't2'),
    (362, 'oom_predicted', 't1'),
  ]
  # The unfinished probe still aims: its forecast is a hint.
  assert 361 in hints.load([str(path)], head)[0]


def test_a_resumed_forecast_is_judged_again_against_this_runs_budget(tmp_path):
  path = tmp_path / 'earlier.jsonl'
  trials = [_trial(10, 'fits', 1000), _trial(11, 'oom_predicted', 1100)]
  path.write_text(json.dumps(_run('t1', trials)) + '\n')
  head = _run('now', [])
  assert len(hints.decided([str(path)], head, budget=1050)) == 2
  assert [t.examples for t in hints.decided([str(path)], head, budget=999)] == [11]  # 10 over now
  assert [t.examples for t in hints.decided([str(path)], head, budget=1100)] == [10]  # 11 fits now


def test_runs_that_disagree_resolve_to_the_later_one(tmp_path):
  """310 ran out of memory in one run (a flaky workspace failure), 320 ran in a later one: the
  resumed search starts from the later run, not from a contradiction."""
  path = tmp_path / 'earlier.jsonl'
  first = _run('2026-12-01T01:00:00', [_trial(300, 'fits', 300), _trial(310, 'oom_run', 310)])
  second = _run('2026-12-01T02:00:00', [_trial(320, 'fits', 320), _trial(330, 'oom_run', 330)])
  path.write_text(json.dumps(second) + '\n' + json.dumps(first) + '\n')  # file order is not time
  got = hints.decided([str(path)], _run('now', []), budget=None)
  assert [(t.examples, t.outcome) for t in got] == [(300, 'fits'), (320, 'fits'), (330, 'oom_run')]


def test_the_later_record_of_a_batch_wins_and_keeps_its_first_runs_time(tmp_path):
  """A resumed run's record repeats the earlier trials with their own time: still the first."""
  path = tmp_path / 'earlier.jsonl'
  first = _run('t1', [_trial(5, 'oom_run', 500)])
  carried = {**_trial(5, 'oom_run', 500), 'earlier': 't1'}
  second = _run('t2', [carried, _trial(4, 'fits', 400)])
  path.write_text(json.dumps(first) + '\n' + json.dumps(second) + '\n')
  got = hints.decided([str(path)], _run('now', []), budget=None)
  assert [(t.examples, t.earlier) for t in got] == [(4, 't2'), (5, 't1')]


def test_forecasts_are_earlier_compiles_of_the_same_program_compiled_the_same_way(tmp_path):
  path = tmp_path / 'earlier.jsonl'
  deviceless = _record(
    device={'platform': 'gpu', 'kind': 'NVIDIA H200', 'pool_bytes': None, 'deviceless': True},
    search={'trials': [{'examples': 188, 'predicted_peak_bytes': 23000}]},
  )
  later = _record(
    timestamp='2026-12-01T10:00:00',
    memory={'limit_bytes': 24 * 10**9},  # another memory cap: forecasts do not depend on it
    search={'trials': [{'examples': 2, 'predicted_peak_bytes': 1600, 'outcome': 'fits'}]},
  )
  lines = [_record(timestamp='2026-11-30T09:00:00'), _record(precision='bf16'), deviceless, later]
  path.write_text('\n'.join(json.dumps(r) for r in lines) + '\n')
  on_device = hints.forecasts([str(path)], _record())
  assert on_device == {
    1: (1480, '2026-11-30T09:00:00'),
    188: (23906, '2026-11-30T09:00:00'),  # not the deviceless compile's 23000
    2: (1600, '2026-12-01T10:00:00'),
  }
  assert hints.forecasts([str(path)], deviceless) == {188: (23000, None)}


def test_forecasts_judged_against_a_run_fill_in_where_nothing_ran():
  """A resumed run adds the earlier forecasts (a --predict's at another cap too) as what
  compiling them again would decide under its budget, without contradicting what ran."""
  ran = hints.decided([], _record(), budget=None)  # nothing ran under this memory: []
  earlier = {1: (100, 'p'), 11: (1100, 'p'), 12: (1200, 'p'), 13: (1300, 'p'), 20: (2000, 'p')}
  judged = hints.forecast_trials(earlier, budget=1250, example_size=2, max_examples=1 << 20)
  assert [(t.examples, t.outcome, t.batch, t.run_s) for t in judged] == [
    (1, 'fits', 2, None),
    (11, 'fits', 22, None),
    (12, 'fits', 24, None),
    (13, 'oom_predicted', 26, None),  # the first over the budget ends them: 20 is not taken
  ]
  assert hints.combined(ran, judged) == judged
  # What ran wins: 12 ran out of memory although its forecast fits, so no fit by forecast
  # at or above it is taken; 1 ran, so its forecast is not taken twice.
  ran = [_as_trial(1, 'fits', 100, 't'), _as_trial(12, 'oom_run', 1200, 't')]
  got = hints.combined(ran, judged)
  assert [(t.examples, t.outcome, t.earlier) for t in got] == [
    (1, 'fits', 't'),
    (11, 'fits', 'p'),
    (12, 'oom_run', 't'),
    (13, 'oom_predicted', 'p'),
  ]
  # A failure by forecast at or below a batch that ran is dropped.
  ran = [_as_trial(13, 'fits', 1240, 't')]
  assert [t.examples for t in hints.combined(ran, judged)] == [1, 11, 12, 13]


def _as_trial(n, outcome, peak, when):
  from jaxbench.core import probe

  return probe.Trial(
    examples=n, batch=n, outcome=outcome, predicted_peak_bytes=peak, run_s=1.0, earlier=when
  )


def test_lines_that_are_not_results_are_reported_once_and_skipped(tmp_path, capsys):
  path = tmp_path / 'hints.jsonl'
  bad = [
    {**_record(), 'config': 'x'},
    {**_record(), 'search': {'trials': 'oops'}},
    {k: v for k, v in _record().items() if k != 'status'},
  ]
  path.write_text('\n'.join(json.dumps(r) for r in [*bad, _record()]) + '\n')
  peaks, matched, _ = hints.load([str(path)], _record())
  assert matched == 1 and peaks == {1: 1480, 188: 23906}
  assert hints.forecasts([str(path)], _record())[188][0] == 23906
  err = capsys.readouterr().err.splitlines()
  assert err == [
    f"warning: {path}:1: 'config' is not a dict; skipped",
    f"warning: {path}:2: 'search.trials' is not a list; skipped",
    f"warning: {path}:3: no 'status'; skipped",
  ]  # once, though read twice


def test_a_file_that_is_not_a_store_is_reported_not_ignored(tmp_path, capsys):
  path = tmp_path / 'weights.bin'
  path.write_bytes(bytes(range(256)))
  assert hints.load([str(path)], _record()) == ({}, 0, [])
  assert capsys.readouterr().err.startswith(f'warning: {path}:1: not JSON; skipped')
