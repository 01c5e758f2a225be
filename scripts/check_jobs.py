"""Checks a job file of scripts/gpu_queue.py on this host before device time is spent on it.

  python3 scripts/check_jobs.py scripts/jobs/h200_pending.txt [...]

Each job line is given to `python -m jaxbench.main LINE --check` on the CPU: jaxbench validates
the command as its run would (unknown flags, conflicting flags, --steps below --windows, files
named in --search_hints; a sweep's cells too), prints one line and stops, building and compiling
nothing. A line that would be refused is printed with its line number and jaxbench's one-line
error (or the queue's, for a tag it does not know), and the exit status is 1. Session 12 wrote
this after a pending list whose stylegan and pix2pixhd lines (--steps=3 with --windows=5) would
each have been refused on the GPU.
"""

import concurrent.futures
import os
import shlex
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_queue  # noqa: E402  (the queue's own reading of a job file)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def jobs(path: str) -> list[tuple[int, str | None, str | None]]:
  """(line number, arguments, None) of each job in the file as the queue reads it, or (line
  number, None, why) where the queue would refuse the line's tags."""
  out = []
  for n, line in gpu_queue.job_lines(path):
    try:
      out.append((n, gpu_queue.parse(line).args, None))
    except ValueError as e:
      out.append((n, None, str(e)))
  return out


def check(args: str) -> str | None:
  """None if jaxbench accepts the arguments; else its error line (or why it could not say)."""
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'CUDA_VISIBLE_DEVICES': ''}
  cmd = [sys.executable, '-m', 'jaxbench.main', *shlex.split(args), '--check']
  try:
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  except subprocess.TimeoutExpired:
    return 'jaxbench --check did not end in 300 s'
  if r.returncode == 0:
    return None
  errors = [line for line in r.stderr.splitlines() if line.startswith('jaxbench: error:')]
  return errors[-1] if errors else f'exit status {r.returncode}: {r.stderr.strip()[-300:]}'


def main(paths: list[str]) -> int:
  queued = [(path, n, args, why) for path in paths for n, args, why in jobs(path)]
  with concurrent.futures.ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
    verdicts = list(pool.map(lambda job: job[3] or check(job[2]), queued))
  bad = [(path, n, why) for (path, n, _, _), why in zip(queued, verdicts) if why]
  for path, n, why in bad:
    print(f'{path}:{n}: {why}')
  print(f'check_jobs: {len(queued) - len(bad)} of {len(queued)} job lines accepted')
  return 1 if bad else 0


if __name__ == '__main__':
  if len(sys.argv) < 2:
    sys.exit('usage: check_jobs.py JOBS_FILE [...]')
  sys.exit(main(sys.argv[1:]))
