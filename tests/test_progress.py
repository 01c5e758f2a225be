"""The live progress line: a phase and elapsed times on a terminal, the plain lines elsewhere."""

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

from jaxbench.core import progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = r"""
import sys, time
from jaxbench.core import progress
line = progress.Line('bert_base', 'sequences')
with progress.Display(line):
  line.set_phase('compiling batch 64 sequences')
  line.trial(32, True)
  line.trial(96, False)
  time.sleep(1.5)
  print('  bert_base: batch 64 sequences: compiling', file=sys.stderr, flush=True)
  time.sleep(0.6)
"""
ANSI = re.compile(r'\x1b\[[0-9;?]*[A-Za-z]')


def _env() -> dict[str, str]:
  return {**os.environ, 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu', 'TERM': 'xterm'}


def _in_terminal(argv: list[str], timeout: float = 300) -> str:
  """What argv writes to a pseudo-terminal as its stderr (stdout to a pipe)."""
  leader, follower = pty.openpty()
  fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack('HHHH', 40, 200, 0, 0))  # 200 columns
  proc = subprocess.Popen(
    argv, stderr=follower, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=_env(), cwd=ROOT
  )
  os.close(follower)
  chunks = []
  while True:
    try:
      data = os.read(leader, 4096)
    except OSError:  # the child closed the terminal
      break
    if not data:
      break
    chunks.append(data)
  proc.wait(timeout=timeout)
  os.close(leader)
  return b''.join(chunks).decode(errors='replace')


def test_clock():
  assert progress.clock(7.25) == '7.2 s' or progress.clock(7.25) == '7.3 s'
  assert progress.clock(725) == '12:05'
  assert progress.clock(3723) == '1:02:03'


def test_line_shows_phase_elapsed_and_bracket():
  t = [100.0]
  line = progress.Line('yolov3', 'images', now=lambda: t[0])
  line.set_phase('compiling batch 64 images')
  t[0] += 75
  line.trial(32, True)
  line.trial(128, False)
  line.trial(48, True)
  assert line.text() == (
    'yolov3: compiling batch 64 images | 1:15 (run 1:15) | fits 48, fails 128 images'
  )
  line.set_phase('running batch 64 images')
  t[0] += 2
  assert line.text().startswith('yolov3: running batch 64 images | 2.0 s (run 1:17)')


def test_terminal_shows_the_phase_and_elapsed_time():
  pytest.importorskip('rich')
  out = _in_terminal([sys.executable, '-c', SCRIPT])
  assert 'bert_base: compiling batch 64 sequences' in out
  assert re.search(r'\| \d+\.\d s \(run \d+\.\d s\)', ANSI.sub('', out))
  assert 'fits 32, fails 96 sequences' in out
  assert 'bert_base: batch 64 sequences: compiling' in out  # the log's line still shows


def test_plain_lines_when_not_a_terminal():
  proc = subprocess.run(
    [sys.executable, '-c', SCRIPT], capture_output=True, text=True, env=_env(), cwd=ROOT
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stderr == '  bert_base: batch 64 sequences: compiling\n'


RUN = [
  sys.executable,
  '-m',
  'jaxbench.main',
  '--model=bert_base',
  '--tiny',
  '--batch_size=2',
  '--steps=2',
  '--windows=1',
  '--warmup_steps=1',
]


def test_a_run_in_a_terminal_shows_its_phases():
  pytest.importorskip('rich')
  out = ANSI.sub('', _in_terminal(RUN))
  assert 'bert_base: compiling batch 2 sequences |' in out
  assert re.search(r'bert_base: [a-z ,]+batch 2 sequences \| \d+\.\d s \(run \d+\.\d s\)', out)
  assert 'bert_base: batch 2 sequences: fits' in out  # the plain lines are kept above it


def test_a_sweeps_line_says_cells_done_and_the_mean_cell_time(tmp_path):
  from tests import test_sweep  # pylint: disable=g-import-not-at-top

  path = str(tmp_path / 's.jsonl')
  failed, lines = test_sweep._run(path, test_sweep._cells(gpus=('rtx_2060',)))
  assert failed == 0
  done = [line for line in lines if line.startswith('[')]
  assert len(done) == 3
  for i, line in enumerate(done, 1):
    assert re.search(rf'\| {i}/3 run, \d+m\d\ds a cell on average, elapsed \d+m\d\ds, ~', line)
