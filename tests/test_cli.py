"""The command line: one clear line and status 2 for bad input, results as JSON lines."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from jaxbench.cards import catalog
from models import registry
from tests import forked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def jaxbench(*args, timeout=600):
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu'}
  return subprocess.run(
    [sys.executable, '-m', 'jaxbench.main', *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


# A run that ends in seconds on the CPU: tiny BERT, a fixed batch, two timed windows.
TINY_FIXED_BATCH = (
  '--model=bert_base',
  '--tiny',
  '--batch_size=4',
  '--steps=2',
  '--windows=2',
  '--warmup_steps=1',
  '--precision=bf16',
)


def started(*args, env=None):
  """A tiny jaxbench run in the background, its stderr (the progress) a line-buffered text pipe;
  `env` adds to the environment."""
  return subprocess.Popen(
    [sys.executable, '-m', 'jaxbench.main', '--tiny', '--steps=1', '--windows=1', *args],
    cwd=ROOT,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu', **(env or {})},
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )


BAD_INPUT = [
  (['--model=resnet_9000'], 'valid models: '),
  (['--list_models', '--model=bert_base'], '--list_models takes no'),
  (['--model=bert_base', '--describe', '--batch_size=8'], '--describe runs nothing'),
  (['--model=bert_base', '--steps=2', '--windows=5'], 'at least --windows'),
  (['--model=bert_base', '--set=no_such_key=3'], 'no config key'),
  (['--model=bert_base', '--set=oops'], 'KEY=VALUE'),
  (['--model=conv_seq2seq', '--set=conv_impl=cudnn'], 'conv_impl must be one of'),
  (['--model=transformer_big', '--notiny', '--batch_size=10'], 'less than one example'),
  (['--model=bert_base', '--output=/no/such/dir/out.jsonl'], 'does not exist'),
  (['--model=bert_base', '--search_hints=/no/such/file.jsonl'], 'is not a file'),
  (['--model=bert_base', '--search_resume'], '--search_resume goes on with a search'),
  (
    ['--model=bert_base', '--search_resume', '--search_hints=README.md', '--batch_size=8'],
    'and no --batch_size',
  ),
  (
    ['--model=bert_base', '--search_resume', '--predict', '--memory_gb=8'],
    '--search_resume goes on with a search',
  ),
  (['--model=bert_base', '--norun_every_fit', '--batch_size=8'], 'is for searches'),
  (['--model=bert_base', '--norun_every_fit', '--verify_predicted_oom'], 'give one of them'),
  (['--model=bert_base', '--norun_every_fit', '--predict', '--memory_gb=8'], 'runs nothing'),
  (['--model=bert_base', '--probe_autotune_level=0', '--batch_size=8'], 'not with --batch_size'),
  (
    ['--model=bert_base', '--probe_autotune_level=0', '--verify_predicted_oom'],
    'not with --verify_predicted_oom',
  ),
  (['--model=bert_base', '--probe_autotune_level=0', '--predict', '--gpu=t4'], 'compiles only'),
  (['--model=bert_base', '--check', '--describe'], '--check validates a run'),
  (['--model=bert_base', '--check', '--steps=2', '--windows=5'], 'at least --windows'),
  ([], '--model'),
  (['--model=bert_base', 'stray'], 'unexpected arguments'),
]


PROGRESS_CONFLICTS = [
  (['--model=bert_base', '--progress_file=/nonexistent/dir/p.json'], 'does not exist'),
  (['--model=bert_base', '--describe', '--progress_file=PROGRESS'], 'takes no --progress_file'),
  (
    ['--model=bert_base', '--output=PROGRESS', '--progress_file=PROGRESS'],
    'must be different files',
  ),
]


@pytest.fixture(scope='module')
def quick_runs(tmp_path_factory):
  """This module's command lines that end at their flags, a --check, --list_models or
  --describe, run in one batch (tests/forked.py): {key: (run, a directory of its own)}."""
  lines, dirs = {}, {}
  for i, (args, _) in enumerate(BAD_INPUT):
    dirs['bad', i] = tmp_path_factory.mktemp('bad_input')
    takes_output = (
      not any('output' in a for a in args)
      and args
      and '--describe' not in args
      and '--list_models' not in args
    )
    out = f'--output={dirs["bad", i] / "r.jsonl"}'
    lines['bad', i] = [*args, out if takes_output else '--seed=0']
  for i, (args, _) in enumerate(PROGRESS_CONFLICTS):
    dirs['progress', i] = tmp_path_factory.mktemp('progress')
    lines['progress', i] = [
      a.replace('PROGRESS', str(dirs['progress', i] / 'p.json')) for a in args
    ]
  check = dirs['check'] = dirs['sweep'] = tmp_path_factory.mktemp('check')
  lines['check'] = [
    '--model=stylegan,bert_base',
    '--precision=bf16',
    '--batch_size=8',
    '--check',
    f'--output={check / "r.jsonl"}',
  ]
  lines['sweep'] = ['--model=bert_base', '--gpus=t4,v100_16', f'--store={check / "cells.jsonl"}']
  lines['sweep'].append('--check')
  lines['list'] = ['--list_models']
  lines['describe'] = ['--model=bert_base,transformer_big', '--describe']
  keys = list(lines)
  return {k: (r, dirs.get(k)) for k, r in zip(keys, forked.run([lines[k] for k in keys]))}


@pytest.mark.parametrize('args, says', BAD_INPUT)
def test_bad_input_is_one_line_and_status_2(args, says, quick_runs):
  r, where = quick_runs['bad', BAD_INPUT.index((args, says))]
  assert r.returncode == 2, (r.returncode, r.stderr)
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and 'Traceback' not in r.stderr, r.stderr
  assert says in lines[0], lines[0]
  assert not (where / 'r.jsonl').exists()  # nothing half-written


@pytest.mark.parametrize('args, message', PROGRESS_CONFLICTS)
def test_progress_file_conflicts_are_one_line_and_status_2(quick_runs, args, message):
  r, where = quick_runs['progress', PROGRESS_CONFLICTS.index((args, message))]
  assert r.returncode == 2, r.stderr
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], r.stderr
  assert not (where / 'p.json').exists()


def test_check_validates_a_run_and_a_sweep_and_builds_nothing(quick_runs):
  r, where = quick_runs['check']
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == 'jaxbench: ok: the flags are valid for stylegan, bert_base'
  r, _ = quick_runs['sweep']
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == 'jaxbench: ok: the flags are valid for a sweep of 2 cells'
  assert not (where / 'r.jsonl').exists() and not (where / 'cells.jsonl').exists()


def test_list_models_names_every_workload(quick_runs):
  r, _ = quick_runs['list']
  assert r.returncode == 0, r.stderr
  listed = [line.split()[0] for line in r.stdout.strip().splitlines()]
  assert listed == registry.names()


def test_describe_gives_exact_parameter_counts(quick_runs):
  r, _ = quick_runs['describe']
  assert r.returncode == 0, r.stderr
  described = {d['name']: d for d in map(json.loads, r.stdout.strip().splitlines())}
  assert described['bert_base']['params'] == 110_106_428  # HF BertForPreTraining
  assert described['transformer_big']['params'] == 209_911_808
  assert described['transformer_big']['unit'] == 'tokens'
  assert described['bert_base']['config']['seq_len'] == 128
  # fairseq's sentences in multiples of 8; any batch of BERT's sequences.
  assert described['transformer_big']['batch_multiple'] == 8
  assert described['bert_base']['batch_multiple'] == 1


@pytest.fixture(scope='module')
def fixed_batch_twice(tmp_path_factory):
  """A fixed-batch run into an output that holds an earlier result, with a progress file and a
  compilation cache, then the same run again: [(run, output, progress file)] (the tests below
  share their compiles: some 8 s each on one core)."""
  where, runs = tmp_path_factory.mktemp('fixed_batch'), []
  for i in range(2):
    out, progress = where / f'r{i}.jsonl', where / f'p{i}.json'
    out.write_text('{"earlier": "result"}\n')
    r = jaxbench(
      *TINY_FIXED_BATCH,
      f'--compilation_cache_dir={where / "cache"}',
      f'--output={out}',
      f'--progress_file={progress}',
    )
    runs.append((r, out, progress))
  return runs


@pytest.mark.slow
def test_fixed_batch_run_appends_one_json_line_with_every_field(fixed_batch_twice):
  r, out, _ = fixed_batch_twice[0]
  assert r.returncode == 0, r.stderr
  lines = out.read_text().splitlines()
  assert len(lines) == 2
  result = json.loads(lines[1])
  assert result['schema'] == 'jaxbench.result/1'
  assert result['status'] == 'ok' and result['precision'] == 'bf16'
  assert result['max_batch'] == 4 and result['search']['mode'] == 'fixed'
  m = result['measurement']
  assert m['examples'] == 4 and len(m['window_step_s']) == 2
  assert m['units_per_s'] == pytest.approx(4 / m['median_step_s'])
  assert m['tflops_per_s'] > 0 and m['predicted_peak_bytes'] > 0
  assert result['device']['platform'] == 'cpu'
  # The table and its notes are the output; the header and each probe, as it starts, the log.
  table = r.stdout.strip().splitlines()
  assert table[0].split()[:3] == ['workload', 'precision', 'device'], r.stdout
  assert table[2].startswith('bert_base  bf16') and table[2].split()[-1] == 'ok', r.stdout
  assert 'ran on the CPU' in r.stdout and 'sequences/s' in r.stdout
  assert r.stderr.startswith('bert_base: fixed batch (tiny preset)\n'), r.stderr
  assert '  bert_base: batch 4 sequences: compiling\n' in r.stderr
  assert re.search(r'  bert_base: batch 4 sequences: compiled in \d+\.\d s, running\n', r.stderr)
  assert '  bert_base: timing at 4 sequences\n' in r.stderr
  assert 'compiling' not in r.stdout and 'workload' not in r.stderr


def test_a_run_that_ends_removes_its_progress_file(fixed_batch_twice):
  for r, out, progress in fixed_batch_twice:
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text().splitlines()[-1])['status'] == 'ok'
    assert not progress.exists() and not list(progress.parent.glob(f'{progress.name}.tmp*'))


def test_a_step_from_the_compilation_cache_is_marked_as_a_load(fixed_batch_twice):
  """--compilation_cache_dir: the second process loads the step; its compile_s is no compile."""
  trials, results = [], []
  for r, out, _ in fixed_batch_twice:
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text().splitlines()[-1])
    (trial,) = result['search']['trials']
    trials.append(trial)
    results.append(result)
    assert result['measurement']['compile_cached'] is trial['cached']
  assert [t['cached'] for t in trials] == [False, True]
  assert [r['search'][k] for r in results for k in ('compiles', 'cache_loads')] == [1, 0, 0, 1]
  assert trials[0]['predicted_peak_bytes'] == trials[1]['predicted_peak_bytes']


@pytest.mark.slow
def test_search_on_the_cpu_under_a_memory_limit(tmp_path):
  out = tmp_path / 'r.jsonl'
  # fp32, not transformer_big's fp16 default: XLA:CPU's fp16 program is some four times the
  # HLO and each of the search's compiles as many times slower (88 s against 26 s for the search).
  r = jaxbench(
    '--model=transformer_big',
    '--tiny',
    '--precision=fp32',
    '--memory_limit_gb=0.002',
    '--steps=2',
    '--windows=1',
    '--warmup_steps=0',
    f'--output={out}',
  )
  assert r.returncode == 0, r.stderr
  result = json.loads(out.read_text())
  trials = result['search']['trials']
  assert result['status'] == 'ok' and result['max_examples'] >= 1
  fit = [t['examples'] for t in trials if t['outcome'] == 'fits']
  fail = [t['examples'] for t in trials if t['outcome'] != 'fits']
  # The next batch transformer_big runs fails: one sentence more below 8, else 8 more (fairseq's
  # multiples of 8).
  m = result['max_examples']
  assert max(fit) == m and min(fail) == (m + 1 if m + 1 < 8 else (m // 8 + 1) * 8)
  assert all(n < 8 or n % 8 == 0 for n in fit + fail)
  assert all(t['predicted_peak_bytes'] <= 2e6 for t in trials if t['outcome'] == 'fits')
  assert result['max_batch'] == result['max_examples'] * result['config']['src_len']


def test_a_killed_run_leaves_its_trials_in_the_progress_file(tmp_path):
  """--progress_file holds the result so far, whole, until the run writes its own.

  SIGKILL (no handler runs) right after the first trial: the file has that trial, status
  'interrupted', and the annotation a stored result has; the output has nothing."""
  out, progress = tmp_path / 'r.jsonl', tmp_path / 'p.json'
  proc = started(
    '--model=bert_base',
    '--max_examples=64',
    '--warmup_steps=0',
    f'--output={out}',
    f'--progress_file={progress}',
  )
  try:
    for line in proc.stderr:
      if re.match(r'  bert_base: batch \d+ sequences: (fits|oom)', line):
        break  # the first trial's line: its checkpoint is written right after it
    else:
      pytest.fail('the search printed no trial')
    # Each line is printed after its checkpoint: the next probe's compile is in the file.
    assert 'compiling' in proc.stderr.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    proc.kill()
  assert out.read_text() == ''  # opened before the run, it holds no result
  record = json.loads(progress.read_text())
  assert record['status'] == 'interrupted'
  assert record['error'].startswith('ended without its result, while searching: compiling batch')
  assert len(record['search']['trials']) >= 1 and record['search']['seconds'] is None
  assert record['mode'] == 'run' and record['emulation'] is None
  assert record['max_examples'] == max(
    (t['examples'] for t in record['search']['trials'] if t['outcome'] == 'fits'), default=0
  )


def test_a_resumed_prediction_compiles_nothing_an_earlier_one_compiled(tmp_path):
  """--predict --search_resume: the first prediction's forecasts are known to the second, at the
  same cards, so it compiles none of them and predicts the same."""
  first, second = tmp_path / 'first.jsonl', tmp_path / 'second.jsonl'
  common = ('--model=bert_base', '--tiny', '--predict', '--gpus=rtx_2060,t4', '--max_examples=3')
  r = jaxbench(*common, f'--output={first}')
  assert r.returncode == 0, r.stderr
  r = jaxbench(*common, '--search_resume', f'--search_hints={first}', f'--output={second}')
  assert r.returncode == 0, r.stderr
  before = [json.loads(line) for line in first.read_text().splitlines()]
  after = [json.loads(line) for line in second.read_text().splitlines()]
  # The predictions, one line per card, are the command's output; its probes went to stderr.
  assert [line.split(' (cap ')[0] for line in r.stdout.splitlines()] == [
    '  bert_base fp32 on rtx_2060',
    '  bert_base fp32 on t4',
  ], r.stdout
  assert sum(x['search']['compiles'] for x in before) >= 2
  assert [x['search']['compiles'] for x in after] == [0, 0]
  assert [x['max_batch'] for x in after] == [x['max_batch'] for x in before]
  assert all(t['earlier'] for x in after for t in x['search']['trials'])
  assert after[0]['search']['resumed']['trials'] == len(after[0]['search']['trials'])


def test_a_search_resumed_from_a_prediction_loads_its_max_and_only_runs_it(tmp_path):
  """A compile-only prediction, then the run: --search_resume takes the prediction's forecasts
  as decided under the run's own budget (fits by forecast, with --norun_every_fit), so the run
  compiles nothing, loads the max from the compilation cache the prediction filled, runs it
  once and times it."""
  cache, first, second = tmp_path / 'cache', tmp_path / 'predicted.jsonl', tmp_path / 'run.jsonl'
  common = ('--model=bert_base', '--tiny', '--max_examples=3', f'--compilation_cache_dir={cache}')
  r = jaxbench(*common, '--predict', '--memory_gb=4', f'--output={first}')
  assert r.returncode == 0, r.stderr
  (predicted,) = [json.loads(line) for line in first.read_text().splitlines()]
  r = jaxbench(
    *common,
    '--memory_limit_gb=4',
    '--search_resume',
    '--norun_every_fit',
    f'--search_hints={first}',
    '--warmup_steps=0',
    '--steps=1',
    '--windows=1',
    f'--output={second}',
  )
  assert r.returncode == 0, r.stderr
  (run,) = [json.loads(line) for line in second.read_text().splitlines()]
  assert run['status'] == 'ok' and run['max_batch'] == predicted['max_batch']
  search = run['search']
  assert search['resumed']['by_forecast'] == len(predicted['search']['trials'])
  assert (search['compiles'], search['cache_loads']) == (0, 1)
  (this,) = [t for t in search['trials'] if not t['earlier']]
  assert this['cached'] and this['run_s'] is not None
  assert this['examples'] == predicted['max_examples']
  assert this['predicted_peak_bytes'] == predicted['predicted_peak_bytes']


@pytest.mark.parametrize('sig', [signal.SIGKILL, signal.SIGINT])
def test_a_prediction_stopped_in_a_compile_keeps_its_probes(tmp_path, sig):
  """--predict logs each probe as it ends and keeps the card it is searching in --progress_file:
  killed (SIGKILL) the file holds its probes so far, status 'interrupted'; interrupted (SIGINT)
  that record goes to the output instead."""
  out, progress = tmp_path / 'r.jsonl', tmp_path / 'p.json'
  proc = started(
    '--model=bert_base',
    '--tiny',
    '--predict',
    '--gpus=lambda2020',  # eight cards: the signal comes long before the last probe
    '--max_examples=64',
    f'--output={out}',
    f'--progress_file={progress}',
    # A cache of its own: with the tests' shared one, other tests' runs may have compiled every
    # probe already, and the prediction end before the signal comes.
    env={'JAX_COMPILATION_CACHE_DIR': str(tmp_path / 'cache')},
  )
  try:
    for line in proc.stderr:
      probe = re.match(r'  bert_base: batch \d+ sequences: fits .*compile .*\(for the (.+)\)', line)
      if probe:
        break
    else:
      pytest.fail('the prediction printed no probe')
    proc.send_signal(sig)
    proc.wait(timeout=60)
  finally:
    proc.kill()
  if sig == signal.SIGKILL:
    assert out.read_text() == ''  # opened before the run, it holds no result
    record = json.loads(progress.read_text())
  else:
    assert proc.returncode == 130 and not progress.exists()
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert record['status'] == 'interrupted' and record['mode'] == 'predict'
  # the card it was searching, or the next one where the signal came between two cards
  assert record['error'].startswith('ended without its result, while predicting for the ')
  cards = catalog.lambda2020()
  later = cards[[g.display for g in cards].index(probe[1]) :]
  (card,) = [g for g in later if record['error'].endswith(f' for the {g.display}')]
  assert record['emulation']['gpu'] == card.name and record['search']['seconds'] is None
  assert record['search']['trials'][0]['predicted_peak_bytes'] > 0
  assert record['max_examples'] == 0  # nothing is claimed for a search that did not end
