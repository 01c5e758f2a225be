"""scripts/h200_session.sh: the daemon that runs a device session's two queues across calls."""

import os
import re
import signal
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'scripts', 'h200_session.sh')


def test_the_daemon_outlives_start_hears_sigint_and_wait_copies_its_files(tmp_path):
  """Started from a script (no job control), a background command would ignore SIGINT, and so
  would every job under it: Python then never sees the queue's SIGINT at the deadline."""
  jobs = tmp_path / 'jobs.txt'
  jobs.write_text('# nothing to run\n')
  out, sess = tmp_path / 'out', tmp_path / 'sess'
  out.mkdir()
  env = {
    **os.environ,
    'H200_SESSION_DIR': str(sess),
    'OUT': str(out),
    'PATH': os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', ''),
  }
  start = [SCRIPT, 'start', str(jobs), '2', '60', str(jobs), '120']
  r = subprocess.run(['bash', *start], cwd=ROOT, env=env, capture_output=True, text=True)
  assert r.returncode == 0 and 'daemon' in r.stdout, r.stderr
  assert (sess / 'repo' / 'scripts' / 'gpu_queue.py').exists()  # it runs a copy of the tree
  r = subprocess.run(
    ['bash', SCRIPT, 'wait', '60'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90
  )
  assert r.returncode == 0 and 'daemon ended' in r.stdout, r.stdout + r.stderr
  log = (sess / 'daemon.log').read_text()
  assert 'phase 1 starts' in log and 'phase 2 starts' in log and 'ended' in log
  assert re.search(r'autotune results at the start: \d+ files in /tmp/atc', log), log
  ignored = int(re.search(r'SigIgn:\s*([0-9a-f]+)', log).group(1), 16)
  assert not ignored & (1 << (signal.SIGINT - 1)), log
  assert {p.name for p in out.iterdir()} >= {'results1.jsonl', 'summary.md', 'logs.tgz', 'atc.tgz'}
  with tarfile.open(out / 'logs.tgz') as logs:  # the autotune cache's file count, once a minute
    assert 'atc_count.log' in logs.getnames()
