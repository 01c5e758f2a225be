"""The report reads its stores through the store's reader: bad lines named, no result refused."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _report(*stores, out):
  return subprocess.run(
    [sys.executable, '-m', 'jaxbench.report_main', f'--store={",".join(stores)}', f'--out={out}'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env={**os.environ, 'PYTHONPATH': ROOT},
  )


@pytest.mark.parametrize('content', [b'', b'\n\n', b'\x00\xff\n{"workload": 1}\n'], ids=range(3))
def test_a_store_without_a_result_is_refused_in_one_line(tmp_path, content):
  path = tmp_path / 's.jsonl'
  path.write_bytes(content)
  done = _report(str(path), out=str(tmp_path / 'out'))
  assert done.returncode == 2 and done.stdout == ''
  assert done.stderr.splitlines() == [
    f'jaxbench.report: error: --store: {path} holds no result '
    '(no line of it is a whole jaxbench result)'
  ]
  assert not os.path.exists(tmp_path / 'out')


@pytest.mark.slow
def test_a_bad_line_is_named_once_and_the_rest_reported(tmp_path):
  path = tmp_path / 's.jsonl'
  with open(os.path.join(ROOT, 'docs', 'results', 'h200.jsonl'), 'rb') as f:
    good = f.readline()
  path.write_bytes(good + b'{"workload": "bert_base", "precision": "fp32"}\n' + good)
  done = _report(str(path), out=str(tmp_path / 'out'))
  assert done.returncode == 0, done.stderr
  assert done.stderr.splitlines() == [f"warning: {path}:2: no 'status'; skipped"]
  assert os.path.isfile(tmp_path / 'out' / 'README.md')
