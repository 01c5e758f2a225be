"""Sweeps: cells, failures recorded, progress, and resume after a kill with nothing lost or doubled.

The cells run tests/fake_cell.py instead of jaxbench.main (a real cell compiles for minutes on
two CPU cores); the command line is grid.command's, so its flags are what a real cell gets.
"""

import collections
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from absl import flags

from jaxbench import cli
from jaxbench import main as jaxbench_main
from jaxbench.cards import grid, sweep
from jaxbench.results import store
from models import registry

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FAKE = os.path.join(HERE, 'fake_cell.py')
WORKLOADS = [('bert_base', 'fp32'), ('transformer_big', 'fp16'), ('mt_dnn', 'fp32')]


def fake_command(store_path):
  def make(group):
    cmd = grid.command(group, store_path, ['--steps=2'])
    assert cmd[1:3] == ['-m', 'jaxbench.main']
    # The workload's revision, which jaxbench records and the fake cannot import in time.
    revision = registry.get(group[0].workload).revision
    return [sys.executable, FAKE] + cmd[3:] + [f'--fake_revision={revision}']

  return make


def _cells(mode='run', gpus=('rtx_2060', 't4')):
  return grid.plan(WORKLOADS, list(gpus), None, True, (('seq_len', '64'),), mode)


def _run(path, cells, timeout_s=60, **kw):
  lines = []
  failed = sweep.run(
    cells, path, fake_command(path), timeout_s, out=lambda s, end='\n': lines.append(s + end), **kw
  )
  return failed, ''.join(lines).splitlines()


def test_plan_and_command():
  cells = grid.plan(WORKLOADS, ['t4'], ['fp32', 'bf16'], False, (), 'run')
  assert [(c.workload, c.precision) for c in cells] == [
    ('bert_base', 'fp32'),
    ('bert_base', 'bf16'),
    ('transformer_big', 'fp32'),
    ('transformer_big', 'bf16'),
    ('mt_dnn', 'fp32'),
    ('mt_dnn', 'bf16'),
  ]
  assert [c.precision for c in _cells()] == ['fp32', 'fp32', 'fp16', 'fp16', 'fp32', 'fp32']
  cmd = grid.command([cells[0]], '/s.jsonl', ['--steps=2'])
  assert cmd[1:] == [
    '-m',
    'jaxbench.main',
    '--model=bert_base',
    '--precision=fp32',
    '--notiny',
    '--gpu=t4',
    '--output=/s.jsonl',
    '--progress_file=/s.jsonl.progress',
    '--steps=2',
  ]
  predict = _cells('predict')
  assert [len(g) for g in grid.groups(predict)] == [2, 2, 2]  # one process per workload
  predict_cmd = grid.command(grid.groups(predict)[0], '/s', [])
  assert '--gpus=rtx_2060,t4' in predict_cmd
  assert not any(a.startswith('--progress_file') for a in predict_cmd)  # --predict takes none


def test_a_resumed_sweep_resumes_runs_from_the_store_once_there_is_one(tmp_path):
  (cell,) = grid.plan(WORKLOADS[:1], ['t4'], ['fp32'], False, (), 'run')
  store_path = str(tmp_path / 's.jsonl')
  assert '--search_resume' not in grid.command([cell], store_path, ['--search_resume'])
  open(store_path, 'w').close()
  cmd = grid.command([cell], store_path, ['--search_resume'])
  assert '--search_resume' in cmd and f'--search_hints={store_path}' in cmd
  predict = grid.groups(_cells('predict'))[0]
  assert '--search_resume' not in grid.command(predict, store_path, ['--search_resume'])
  assert '--norun_every_fit' in grid.command([cell], store_path, ['--norun_every_fit'])
  assert '--norun_every_fit' not in grid.command(predict, store_path, ['--norun_every_fit'])


def test_each_cell_gets_the_sweeps_own_values():
  """passthrough's flags, parsed as a cell parses them, give back the sweep's values."""
  given = cli.Args(
    steps=7,
    windows=7,
    warmup_steps=0,
    seed=3,
    max_examples=64,
    search_tolerance=0.05,
    remat=True,
    verify_predicted_oom=True,
    autotune_level=2,
    compilation_cache_dir='/cache',
    autotune_cache_dir='/tuned',
    search_resume=True,
    run_every_fit=False,
  )
  try:
    flags.FLAGS(['jaxbench', *grid.passthrough(given)])
    cell = jaxbench_main.read_args()
  finally:
    flags.FLAGS.unparse_flags()
  passed = {
    f.name
    for f in dataclasses.fields(cli.Args)
    if getattr(given, f.name) != getattr(cli.Args(), f.name)
  }
  assert {n: getattr(cell, n) for n in passed} == {n: getattr(given, n) for n in passed}
  assert grid.passthrough(cli.Args(probe_autotune_level=0))[-1] == '--probe_autotune_level=0'


def test_the_sweeps_progress_goes_to_stderr(tmp_path, capsys):
  path = str(tmp_path / 's.jsonl')
  assert sweep.run(_cells(gpus=('t4',))[:1], path, fake_command(path), 60) == 0
  out, err = capsys.readouterr()
  assert out == ''
  assert err.splitlines()[0] == f'sweep: 1 cells, 0 already in {path}, 1 to run'
  assert err.splitlines()[-1] == 'sweep: done, 0 failed this run'


def test_an_interrupted_cell_is_not_done(tmp_path):
  """A cell whose run was stopped by Ctrl-C (status 'interrupted') runs again on resume."""
  path = str(tmp_path / 's.jsonl')
  cells = _cells(gpus=('t4',))[:1]
  _run(path, cells)
  (record,) = store.read(path)[0]
  with open(path, 'w') as f:
    f.write(json.dumps({**record, 'status': 'interrupted'}) + '\n')
  failed, lines = _run(path, cells)
  assert failed == 0 and lines[0] == f'sweep: 1 cells, 0 already in {path}, 1 to run'
  assert [r['status'] for r in store.read(path)[0]] == ['interrupted', 'ok']


def test_a_cell_done_by_an_earlier_revision_of_its_workload_runs_again(tmp_path, monkeypatch):
  """After a workload's program changes (Workload.revision), its stored figures are stale."""
  path = str(tmp_path / 's.jsonl')
  cells = _cells(gpus=('t4',))[:1]
  _run(path, cells)
  (record,) = store.read(path)[0]
  revision = registry.get('bert_base').revision
  with open(path, 'w') as f:
    f.write(json.dumps({**record, 'workload_revision': revision}) + '\n')
  _, lines = _run(path, cells)
  assert lines[0] == f'sweep: 1 cells, 1 already in {path}, 0 to run'
  changed = dataclasses.replace(registry.get('bert_base'), revision=revision + 1)
  get = registry.get
  monkeypatch.setattr(registry, 'get', lambda name: changed if name == 'bert_base' else get(name))
  _, lines = _run(path, cells)
  assert lines[0] == f'sweep: 1 cells, 0 already in {path}, 1 to run'


def test_sweep_records_each_cell_and_skips_them_on_rerun(tmp_path):
  path = str(tmp_path / 's.jsonl')
  failed, lines = _run(path, _cells())
  assert failed == 0
  keys = [store.key_of(r) for r in store.read(path)[0]]
  assert sorted(keys) == sorted(c.key for c in _cells())
  assert lines[0] == f'sweep: 6 cells, 0 already in {path}, 6 to run'
  assert lines[1].startswith('[1/6] bert_base fp32 on rtx_2060 tiny seq_len=64: 8 sequences, 100')
  assert 'elapsed' in lines[6] and 'left' in lines[6] and lines[6].startswith('[6/6]')
  failed, lines = _run(path, _cells())
  assert lines[0].endswith('6 already in ' + path + ', 0 to run')
  assert len(store.read(path)[0]) == 6


def test_predict_cells_share_a_process(tmp_path):
  path = str(tmp_path / 's.jsonl')
  assert _run(path, _cells('predict'))[0] == 0
  records = store.read(path)[0]
  assert {r['mode'] for r in records} == {'predict'} and len(records) == 6
  by_workload = collections.defaultdict(set)
  for r in records:
    by_workload[r['workload']].add(r['pid'])
  assert all(len(pids) == 1 for pids in by_workload.values())


def test_a_crash_and_a_timeout_are_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch):
  path = str(tmp_path / 's.jsonl')
  monkeypatch.setenv('FAKE_CRASH', 'bert_base')
  monkeypatch.setenv('FAKE_HANG', 'mt_dnn')
  failed, lines = _run(path, _cells(), timeout_s=3)
  assert failed == 4
  latest = store.latest(store.read(path)[0])
  status = {(k[1], k[2]): r['status'] for k, r in latest.items()}
  assert status[('transformer_big', 't4')] == 'ok'
  assert status[('bert_base', 't4')] == status[('mt_dnn', 't4')] == 'failed'
  crash = latest[_cells()[0].key]
  assert 'killed by signal 6' in crash['error'] and 'the fake cell crashed' in crash['log_tail']
  hung = latest[_cells()[-1].key]
  assert 'timed out after 3 s' in hung['error']
  # What the hung cell had found stays in its failure record (it aims the retry's search).
  assert 'while searching: compiling batch 16 sequences' in hung['error']
  assert hung['search']['trials'][0]['examples'] == 8 and hung['status'] == 'failed'
  assert 'search' not in crash  # the crash left no progress: a plain failure
  assert not os.path.exists(grid.progress_path(path))
  assert crash['emulation']['cap_bytes'] == 6 * 2**30 - 768 * 2**20
  monkeypatch.delenv('FAKE_CRASH')
  assert _run(path, _cells())[1][0].endswith('0 to run')  # failures count as done ...
  monkeypatch.delenv('FAKE_HANG')
  assert _run(path, _cells(), retry_failed=True)[0] == 0  # ... until retried
  latest = store.latest(store.read(path)[0])
  assert {r['status'] for r in latest.values()} == {'ok'} and len(latest) == 6


def test_a_corrupt_trailing_line_is_reported_and_the_sweep_appends_whole_lines(tmp_path):
  path = str(tmp_path / 's.jsonl')
  with open(path, 'w') as f:
    f.write('{"workload": "bert_ba')
  failed, lines = _run(path, _cells(gpus=('t4',)))
  assert (
    failed == 0 and lines[0] == f'warning: {path}:1: cut short (a write stopped mid-line?); skipped'
  )
  records, warning = store.read(path)
  assert len(records) == 3 and warning == f'warning: {path}:1: not JSON; skipped'


DRIVER = '''
import sys
sys.path[:0] = [{root!r}, {here!r}]
from jaxbench.cards import sweep
import test_sweep
cells = test_sweep._cells(gpus=('rtx_2060', 't4', 'l4', 'a10'))
sweep.run(cells, {path!r}, test_sweep.fake_command({path!r}), 60)
'''


@pytest.mark.slow
def test_a_sweep_killed_mid_way_resumes_with_nothing_lost_or_doubled(tmp_path):
  path = str(tmp_path / 's.jsonl')
  env = {**os.environ, 'FAKE_SLEEP': '0.3'}
  proc = subprocess.Popen(
    [sys.executable, '-c', DRIVER.format(root=ROOT, here=HERE, path=path)],
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.monotonic() + 60
  while len(store.read(path)[0]) < 4 and time.monotonic() < deadline:
    time.sleep(0.05)
  os.kill(proc.pid, signal.SIGKILL)  # the sweep dies mid-way; its running cell dies with it
  proc.wait()
  done = len(store.read(path)[0])
  assert 4 <= done < 12
  time.sleep(1.0)  # an orphaned cell would write within 0.3 s
  assert len(store.read(path)[0]) == done
  cells = _cells(gpus=('rtx_2060', 't4', 'l4', 'a10'))
  failed, lines = _run(path, cells)
  assert failed == 0 and lines[0].endswith(f'{done} already in {path}, {12 - done} to run')
  keys = collections.Counter(store.key_of(r) for r in store.read(path)[0])
  assert set(keys) == {c.key for c in cells} and set(keys.values()) == {1}
  assert store.read(path)[1] is None


BAD_LINES = [
  b'{"workload": "bert_base", "precis',  # cut short
  b'not json at all',
  b'\x00\xff\xfe binary',
  b'[1, 2]',
  b'"a string"',
  b'{"workload": "bert_base", "precision": "fp32"}',  # no status
  b'{"workload": "bert_base", "precision": "fp32", "status": 7}',
  b'{"workload": "bert_base", "precision": "fp32", "status": "ok", "max_batch": 1, "config": "x"}',
  b'{"workload": "bert_base", "precision": "fp32", "status": "oom", "search": {"trials": "oops"}}',
  b'{"workload": "bert_base", "precision": "fp32", "status": "oom", "search": {"trials": [1]}}',
  b'{"workload": "bert_base", "precision": "fp32", "status": "oom", "overrides": "seq_len=64"}',
  b'{"workload": "bert_base", "precision": "fp32", "status": "oom", "emulation": "t4"}',
]


def test_lines_of_the_wrong_shape_are_reported_once_and_the_cells_run(tmp_path):
  """Each line that is not a result is named once (FILE:LINE) and skipped: the cells still to
  run read the store as their --search_hints and run; a status the sweep does not know is not
  done."""
  path = str(tmp_path / 's.jsonl')
  cells = _cells(gpus=('t4',))
  _run(path, cells[:1])
  (done,) = store.read(path)[0]
  unknown = {**done, 'workload': 'mt_dnn', 'status': 'finished?'}  # a newer writer's status
  with open(path, 'ab') as f:
    f.write(b'\n'.join(BAD_LINES[1:]) + b'\n' + json.dumps(unknown).encode() + b'\n')
    f.write(BAD_LINES[0])
  failed, lines = _run(path, cells)
  warnings = [line for line in lines if line.startswith('warning:')]
  assert len(warnings) == 5 + 1  # five named, then counted
  assert warnings[0] == f'warning: {path}:2: not JSON; skipped'
  assert warnings[-1] == f'warning: {path}: {len(BAD_LINES) - 5} more lines that are not results'
  assert failed == 0 and lines[len(warnings)].endswith('1 already in ' + path + ', 2 to run')
  latest = store.latest(store.read(path)[0])
  assert {r['status'] for r in latest.values()} == {'ok'} and len(latest) == 3
  assert latest[cells[2].key]['hint_peaks'] == {}  # its hints were read, the bad lines skipped


def test_a_cell_that_another_writer_records_meanwhile_is_skipped(tmp_path):
  path = str(tmp_path / 's.jsonl')
  cells = _cells(gpus=('t4',))
  make = fake_command(path)

  def and_another_writer(group):
    if group[0] == cells[0]:  # while the first cell runs, someone else records the second
      subprocess.run(make([cells[1]]), check=True, env={**os.environ})
    return make(group)

  lines = []
  failed = sweep.run(cells, path, and_another_writer, 60, out=lambda s, end='\n': lines.append(s))
  assert failed == 0 and any('(recorded meanwhile)' in line for line in lines)
  keys = collections.Counter(store.key_of(r) for r in store.read(path)[0])
  assert set(keys) == {c.key for c in cells} and set(keys.values()) == {1}


def test_a_cell_that_ends_interrupted_is_not_done_and_counts_as_failed(tmp_path, monkeypatch):
  """A cell stopped by a SIGINT of its own writes its search so far ('interrupted')."""
  path = str(tmp_path / 's.jsonl')
  cells = _cells(gpus=('t4',))[:1]
  monkeypatch.setenv('FAKE_HANG', 'bert_base')
  make = fake_command(path)

  def interrupted_soon(group):
    cmd = make(group)
    # As a Ctrl-C to the cell's own process: a SIGINT a moment after it wrote its progress.
    shell = f'{sys.executable} -c "import time; time.sleep(1)"; kill -INT $$'
    return ['bash', '-c', f'({shell}) & exec "$@"', 'cell', *cmd]

  lines = []
  failed = sweep.run(cells, path, interrupted_soon, 60, out=lambda s, end='\n': lines.append(s))
  assert failed == 1 and lines[-1].startswith('sweep: done, 1 failed this run')
  (record,) = store.read(path)[0]
  assert record['status'] == 'interrupted' and record['search']['trials'][0]['examples'] == 8
  monkeypatch.delenv('FAKE_HANG')
  failed, lines = _run(path, cells)
  assert failed == 0 and lines[0].endswith('0 already in ' + path + ', 1 to run')
  assert store.latest(store.read(path)[0])[cells[0].key]['hint_peaks'] == {'8': 1000}


SIGINT_DRIVER = '''
import sys
sys.path[:0] = [{root!r}, {here!r}]
from jaxbench.cards import sweep
import test_sweep
cells = test_sweep._cells(gpus=('t4',))
try:
  sys.exit(1 if sweep.run(cells, {path!r}, test_sweep.fake_command({path!r}), 60) else 0)
except KeyboardInterrupt:
  sys.exit(130)  # as sweep.main
'''


def _sweep_process(path, **env):
  return subprocess.Popen(
    [sys.executable, '-c', SIGINT_DRIVER.format(root=ROOT, here=HERE, path=path)],
    env={**os.environ, **env},
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )


def _wait_for(predicate, timeout_s=60):
  deadline = time.monotonic() + timeout_s
  while not predicate():
    assert time.monotonic() < deadline
    time.sleep(0.05)


def test_a_sigint_to_a_sweep_stops_it_and_its_cells_search_aims_the_retry(tmp_path):
  path = str(tmp_path / 's.jsonl')
  proc = _sweep_process(path, FAKE_HANG='transformer_big')  # the second cell hangs
  _wait_for(lambda: os.path.exists(grid.progress_path(path)))
  proc.send_signal(signal.SIGINT)  # a Ctrl-C at the terminal reaches the sweep only
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130
  assert (
    err.splitlines()[-1]
    == f'sweep: interrupted, 1 failed or interrupted this run (log: {path}.log)'
  )
  latest = store.latest(store.read(path)[0])
  cells = _cells(gpus=('t4',))
  assert latest[cells[0].key]['status'] == 'ok' and cells[2].key not in latest
  cut = latest[cells[1].key]
  assert (
    cut['status'] == 'interrupted' and cut['search']['trials'][0]['predicted_peak_bytes'] == 1000
  )
  assert not os.path.exists(grid.progress_path(path))
  failed, lines = _run(path, cells)
  assert failed == 0 and lines[0].endswith('1 already in ' + path + ', 2 to run')
  assert store.latest(store.read(path)[0])[cells[1].key]['hint_peaks'] == {'8': 1000}


def test_a_sweep_killed_mid_cell_keeps_the_cells_search_for_the_retry(tmp_path):
  """SIGKILL gives the sweep no moment to act: the next run finds the cell's progress file."""
  path = str(tmp_path / 's.jsonl')
  proc = _sweep_process(path, FAKE_HANG='transformer_big')
  _wait_for(lambda: os.path.exists(grid.progress_path(path)))
  proc.kill()
  proc.wait()
  cells = _cells(gpus=('t4',))
  failed, lines = _run(path, cells)
  assert failed == 0 and lines[0].endswith('1 already in ' + path + ', 2 to run')
  records = store.read(path)[0]
  assert [r['status'] for r in records] == ['ok', 'interrupted', 'ok', 'ok']
  assert 'the sweep stopped while this cell ran' in records[1]['error']
  assert store.latest(records)[cells[1].key]['hint_peaks'] == {'8': 1000}


def test_two_sweeps_on_one_store_through_a_symlink_do_not_both_run(tmp_path):
  path = str(tmp_path / 's.jsonl')
  link = str(tmp_path / 'link.jsonl')
  os.symlink(path, link)
  with store.Lock(path):
    with pytest.raises(store.Busy, match='another sweep'):
      with store.Lock(link):
        pass
  with store.Lock(link):  # a single run with --output through either name is refused too
    with pytest.raises(store.Busy, match='a sweep is writing'):
      with store.Lock(path, shared=True):
        pass


@pytest.mark.slow
def test_a_sweep_killed_at_random_moments_resumes_with_each_cell_once(tmp_path):
  """Ten SIGKILLs at random moments (starting up, between cells, while a cell writes), each
  followed by a resume: at the end every cell is recorded exactly once, on whole lines."""
  path = str(tmp_path / 's.jsonl')
  cells = _cells(gpus=('rtx_2060', 't4', 'l4', 'a10'))
  rng = random.Random(35)
  driver = [sys.executable, '-c', DRIVER.format(root=ROOT, here=HERE, path=path)]
  env = {**os.environ, 'FAKE_SLEEP': '1.0'}  # a kill window holds at most one cell's result
  for kill in range(10):
    proc = subprocess.Popen(driver, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if kill % 4 == 0:
      time.sleep(rng.uniform(0.2, 1.5))  # while it starts up, or in its first cell
    else:
      assert proc.stderr.readline().startswith(b'sweep: ')  # it has read the store: running
      time.sleep(rng.uniform(0.0, 1.5))
    proc.kill()
    proc.wait()
    proc.stderr.close()
  assert 0 < len(store.read(path)[0]) < len(cells)  # the kills fell in the middle of the sweep
  failed, lines = _run(path, cells)
  assert failed == 0
  data = open(path, 'rb').read()
  assert data.endswith(b'\n') and all(json.loads(line) for line in data.splitlines())
  keys = collections.Counter(store.key_of(r) for r in store.read(path)[0])
  assert set(keys) == {c.key for c in cells} and set(keys.values()) == {1}


def test_a_single_run_does_not_write_to_a_store_a_sweep_is_writing(tmp_path):
  path = str(tmp_path / 's.jsonl')
  link = str(tmp_path / 'link.jsonl')
  os.symlink(path, link)
  run = [sys.executable, '-m', 'jaxbench.main', '--model=bert_base', '--tiny', f'--output={link}']
  with store.Lock(path):
    done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert done.returncode == 2 and not os.path.exists(path)
  assert done.stderr.splitlines()[-1] == (
    f'jaxbench: error: --output: a sweep is writing to this store ({path}.lock is locked)'
  )


LOCKED_DRIVER = '''
import sys
sys.path[:0] = [{root!r}, {here!r}]
from jaxbench.cards import sweep
from jaxbench.results import store
import test_sweep
cells = test_sweep._cells(gpus=('rtx_2060', 't4'))
try:
  with store.Lock({path!r}):  # as sweep.main
    sys.exit(1 if sweep.run(cells, {path!r}, test_sweep.fake_command({path!r}), 60) else 0)
except store.Busy as e:
  print(e, file=sys.stderr)
  sys.exit(2)
'''


def test_two_sweeps_started_at_once_through_a_symlink_record_each_cell_once(tmp_path):
  path = str(tmp_path / 's.jsonl')
  link = str(tmp_path / 'link.jsonl')
  os.symlink(path, link)
  env = {**os.environ, 'FAKE_SLEEP': '0.3'}
  procs = [
    subprocess.Popen(
      [sys.executable, '-c', LOCKED_DRIVER.format(root=ROOT, here=HERE, path=p)],
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
    )
    for p in (path, link)
  ]
  results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
  assert sorted(rc for rc, _ in results) == [0, 2]
  assert any('another sweep' in err for rc, err in results if rc == 2)
  keys = collections.Counter(store.key_of(r) for r in store.read(path)[0])
  assert set(keys) == {c.key for c in _cells()} and set(keys.values()) == {1}
