"""The sweep's JSON Lines store: whole lines, keys, a cut-short last line, the lock."""

import json
import os

import pytest

from jaxbench.results import records as report
from jaxbench.results import store


def _result(workload='bert_base', gpu='t4', status='ok', **kw):
  return {
    'workload': workload,
    'precision': 'fp32',
    'tiny': True,
    'mode': 'run',
    'overrides': [['seq_len', '64']],
    'emulation': {'gpu': gpu},
    'status': status,
    'max_batch': 8,
    **kw,
  }


def test_each_result_is_one_whole_line(tmp_path):
  path = str(tmp_path / 's.jsonl')
  for gpu in ('t4', 'l4', 'h200'):
    report.append_jsonl(path, _result(gpu=gpu, note='line\nbreak inside'))
  lines = open(path).read().split('\n')
  assert lines[-1] == '' and len(lines) == 4
  assert [json.loads(line)['emulation']['gpu'] for line in lines[:3]] == ['t4', 'l4', 'h200']
  records, warning = store.read(path)
  assert len(records) == 3 and warning is None


def test_key_identifies_the_cell():
  a = store.key_of(_result())
  assert a == ('run', 'bert_base', 't4', 'fp32', True, (('seq_len', '64'),))
  assert store.key_of(_result(gpu='l4')) != a
  predicted = store.key_of({**_result(), 'mode': 'predict'})
  assert predicted != a
  deviceless = {**_result(), 'mode': 'predict', 'device': {'deviceless': True}}
  assert store.key_of(deviceless) not in (a, predicted)  # compiled without the GPU: its own cell
  assert store.key_of({**_result(), 'overrides': []}) != a
  assert store.key('run', 'bert_base', 't4', 'fp32', 1, [('seq_len', 64)]) == a


def test_a_cut_short_last_line_is_reported_once_and_skipped(tmp_path):
  path = str(tmp_path / 's.jsonl')
  report.append_jsonl(path, _result(gpu='t4'))
  with open(path, 'a') as f:
    f.write('{"workload": "bert_base", "precis')  # a writer killed mid-line
  records, warning = store.read(path)
  assert [r['emulation']['gpu'] for r in records] == ['t4']
  assert warning == f'warning: {path}:2: cut short (a write stopped mid-line?); skipped'
  store.end_line(path)  # the sweep does this before appending
  report.append_jsonl(path, _result(gpu='l4'))
  records, warning = store.read(path)
  assert [r['emulation']['gpu'] for r in records] == ['t4', 'l4']
  assert warning == f'warning: {path}:2: not JSON; skipped'  # still reported, never a result
  store.end_line(path)
  assert open(path).read().count('\n') == 3  # nothing added to a file that ends a line


def test_missing_store_is_empty(tmp_path):
  assert store.read(str(tmp_path / 'none.jsonl')) == ([], None)


def test_latest_result_of_a_key_wins():
  first, second = _result(status='failed'), _result(status='ok')
  assert store.latest([first, second]) == {store.key_of(first): second}


def test_two_sweeps_cannot_share_a_store(tmp_path):
  path = str(tmp_path / 's.jsonl')
  with store.Lock(path):
    with pytest.raises(store.Busy, match='another sweep'):
      with store.Lock(path):
        pass
  with store.Lock(path):  # released
    pass


OOM = b'{"workload": "bert_base", "precision": "fp32", "status": "oom", '
WRONG_SHAPES = {
  b'not json': 'not JSON',
  b'\x89PNG\r\x00\xff binary': 'not JSON',
  b'[1, 2]': 'not a JSON object but list',
  b'null': 'not a JSON object but NoneType',
  b'{"workload": "bert_base", "precision": "fp32"}': "no 'status'",
  b'{"precision": "fp32", "status": "oom"}': "no 'workload'",
  b'{"workload": "bert_base", "status": "oom"}': "no 'precision'",
  b'{"workload": "bert_base", "precision": "fp32", "status": null}': "'status' is not a name",
  b'{"workload": 3, "precision": "fp32", "status": "oom"}': "'workload' is not a name",
  OOM + b'"config": "x"}': "'config'",
  OOM + b'"tiny": "yes"}': "'tiny'",
  OOM + b'"search": {"trials": "oops"}}': "'search.trials' is not a list",
  OOM + b'"search": {"trials": [1]}}': "'search.trials' item 0 is not a trial",
  OOM + b'"search": [1]}': "'search'",
  OOM + b'"overrides": "a=1"}': "'overrides'",
  OOM + b'"overrides": [["a"]]}': "'overrides' holds ['a']",
  OOM + b'"emulation": {"gpu": 4}}': "'emulation.gpu'",
  b'{"workload": "bert_base", "precision": "fp32", "status": "ok"}': "without a whole 'max_batch'",
  b'{"workload": "bert_base", "precision": "fp32", "status": "ok", "max_batch": 1, '
  b'"measurement": {"units_per_s": 3.0}}': "'measurement.units_per_s' without",
}


@pytest.mark.parametrize('line', list(WRONG_SHAPES), ids=range(len(WRONG_SHAPES)))
def test_a_line_of_the_wrong_shape_is_named_with_its_file_and_line_and_skipped(tmp_path, line):
  path = str(tmp_path / 's.jsonl')
  report.append_jsonl(path, _result(gpu='t4'))
  with open(path, 'ab') as f:
    f.write(line + b'\n')
  report.append_jsonl(path, _result(gpu='l4'))
  records, warning = store.read(path)
  assert [r['emulation']['gpu'] for r in records] == ['t4', 'l4']
  assert warning.startswith(f'warning: {path}:2: ') and warning.endswith('; skipped')
  assert WRONG_SHAPES[line] in warning and '\n' not in warning


def test_a_file_that_is_not_a_store_is_named_line_by_line_up_to_five(tmp_path):
  path = tmp_path / 'photo.png'
  path.write_bytes(b'\x89PNG\r\n\x1a\n\x00\x00' + b'\n'.join(bytes([i, 255]) for i in range(20)))
  records, warning = store.read(str(path))
  assert records == [] and len(warning.splitlines()) == 6
  assert warning.splitlines()[0] == f'warning: {path}:1: not JSON; skipped'
  assert warning.splitlines()[-1] == f'warning: {path}: 17 more lines that are not results'


def test_a_status_this_code_does_not_know_is_kept_but_not_done(tmp_path):
  path = str(tmp_path / 's.jsonl')
  report.append_jsonl(path, _result(status='queued'))
  (record,), warning = store.read(path)
  assert warning is None and not store.done(record)
  assert not store.done(_result(status='interrupted'))
  assert store.done(_result(status='failed')) and not store.done(_result(status='failed'), True)
  assert all(store.done(_result(status=s)) for s in ('ok', 'oom', 'invalid', 'error'))


def test_the_lock_is_the_stores_whatever_its_name(tmp_path, monkeypatch):
  path = str(tmp_path / 's.jsonl')
  os.symlink(path, str(tmp_path / 'link.jsonl'))
  monkeypatch.chdir(tmp_path)
  with store.Lock('s.jsonl', shared=True), store.Lock('link.jsonl', shared=True):
    # Single runs share it; a sweep does not start beside them, by either name.
    for name in (path, 'link.jsonl'):
      with pytest.raises(store.Busy, match='or a run with --output'):
        with store.Lock(name):
          pass
  with store.Lock('link.jsonl'):
    with pytest.raises(store.Busy, match='a sweep is writing'):
      with store.Lock(path, shared=True):
        pass
    monkeypatch.setenv(store.SWEEP_ENV, path)  # the sweep's own cells
    with store.Lock('link.jsonl', shared=True):
      pass
  with store.Lock(None, shared=True):  # a run without --output locks nothing
    pass
