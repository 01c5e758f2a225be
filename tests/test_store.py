"""The sweep's JSON Lines store: whole lines, keys, a cut-short last line, the lock."""

import json

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
