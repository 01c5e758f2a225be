"""scripts/check_jobs.py: a queued job line that jaxbench would refuse is caught on the host."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'scripts', 'check_jobs.py')


def _check(*paths):
  return subprocess.run(
    [sys.executable, SCRIPT, *paths], cwd=ROOT, capture_output=True, text=True, timeout=600
  )


def test_a_refused_line_is_reported_with_its_number_and_the_error(tmp_path):
  jobs = tmp_path / 'jobs.txt'
  jobs.write_text(
    '# a comment\n'
    '--model=stylegan --tiny --steps=5 --windows=5\n'
    '\n'
    '[filler] --model=stylegan --steps=3 --windows=5\n'
    '[soon] --model=stylegan\n'
  )
  r = _check(str(jobs))
  assert r.returncode == 1, r.stdout + r.stderr
  assert f'{jobs}:4: jaxbench: error: --steps (3) must be at least --windows (5)' in r.stdout
  assert f'{jobs}:5: unknown job tag [soon]' in r.stdout
  assert '1 of 3 job lines accepted' in r.stdout


def test_the_pending_device_queue_is_accepted():
  r = _check(os.path.join(ROOT, 'scripts', 'jobs', 'h200_pending.txt'))
  assert r.returncode == 0, r.stdout + r.stderr
