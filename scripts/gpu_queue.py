"""Run a queue of jaxbench commands on every local GPU at once, one command per GPU.

Each line of the job file is the arguments of one `python -m jaxbench.main` run
(blank lines and # comments skipped). One worker per GPU takes the next job,
runs it with CUDA_VISIBLE_DEVICES set to its GPU and its log in OUT/, and takes
another when it ends, until the queue is empty or the deadline comes; a job
still running at the deadline is interrupted (SIGINT, then SIGKILL): it then
appends a result with status 'interrupted' holding its search trials so far. Before
the SIGINT, and again before a SIGKILL, a SIGUSR1 makes the job print every thread's
Python stack into its log (jaxbench.main's faulthandler): where a job that did not
stop was stuck. Each job keeps its result so far in OUT/jobNN.progress.json
(--progress_file; a --predict job, the card it is searching); when a job has to be killed, that
record (status 'interrupted', its trials so far) is appended to the results in its place.
Results go to OUT/results.jsonl (each run appends whole lines), and that file aims the
searches of later jobs (--search_hints); at the end OUT/summary.md (and the output) has them as
docs/results/ table rows (scripts/summarize.py). Where nvidia-smi exists, OUT/gpu_monitor.csv
logs each GPU's clocks, power and throttle reasons once a second. Used for the runs behind
docs/results/.

SLOTS > 1 runs that many jobs on each GPU at once, for compile-only jobs (--predict): one compile
alternates host work (code generation) with autotuning on the GPU, so several at once keep both
busier. Six on one H200 (session 9, call 1) kept it busy in 83% of the seconds nvidia-smi
sampled, each compile taking about 1.2-1.5 times as long as alone (bert_base
23-31 s against 14-25 s; nasnet_large 91-113 s against 71-91 s). Such jobs start with
XLA_PYTHON_CLIENT_PREALLOCATE=false and XLA_PYTHON_CLIENT_MEM_FRACTION=0.95/SLOTS: each takes
the memory its autotuning needs as it goes, and together they cannot take more than the card
(a forecast is the compiler's and does not depend on the pool: in session 9, twelve batches
compiled beside five other jobs forecast the same bytes as in their serial runs). Seen on one
H200 in session 9: six such jobs without a cap ran well (call 1); eight without a cap ran it
out of memory (call 2: autotuning failed, "Failed to get configs", and some compiles came back
out of memory, which for a compile-only job is the neighbours' doing, not the program's); XLA's
platform allocator instead of the pool crashed three of twelve image jobs (SIGSEGV after
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, call 3). With the cap (session 10, four jobs, 35.7 GB
each) bert_base forecast the same bytes as alone, but the autotuners of pix2pixhd fp32 and
stylegan bf16 at the H200's full batch were refused buffers of 12-32 GiB that a full pool grants:
a capped compile of such a program need not pick what a full-memory compile picks, and none of
those four full-batch compiles had ended after 900 s. Share the GPU for the batches of small
cards, not for full-memory image programs.
A queue with SLOTS > 1 refuses any job that would run a step.

A job line that starts with `[filler]` is a filler: it runs only while other jobs do. Once
every other job has ended, fillers still running are stopped as at the deadline and those not
yet started are not started, so that low-priority work (more cards of a table) uses the slots
the main jobs leave free without holding up what comes after the queue.

A job line that starts with `[limit=S]` (alone or beside `[filler]`, in either order) is stopped
as at the deadline once it has run S seconds, and the queue goes on with the next job: for a
job that is worth a bounded share of the session and no more (a diagnostic run, a compile whose
cost is not known yet).

  python3 scripts/gpu_queue.py JOBS OUT DEADLINE_S [GPUS] [SLOTS]
"""

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxbench import report  # noqa: E402  (results I/O only: no JAX in this process)

MIN_START_S = 120  # a job started with less time left could not finish a search
GRACE_S = 60  # after SIGINT at the deadline, before SIGKILL (a step or an init may be in flight)
DUMP_S = 2  # after a SIGUSR1, for the job's stack dump to reach its log
SHARED_FRACTION = 0.95  # of the GPU, split among the compile-only jobs that share it


def with_hints(argv: list[str], results: str) -> list[str]:
  """The job's arguments, its search aimed also by the results this queue has written so far."""
  if not os.path.isfile(results) or any(a.startswith('--batch_size') for a in argv):
    return argv
  given = [a for a in argv if a.startswith('--search_hints=')]
  files = [f for a in given for f in a.split('=', 1)[1].split(',') if f] + [results]
  return [a for a in argv if a not in given] + [f'--search_hints={",".join(files)}']


class Job(NamedTuple):
  args: str  # the arguments of `python -m jaxbench.main`
  filler: bool  # [filler]: runs only while other jobs do
  limit_s: float | None  # [limit=S]: stopped after S seconds, as at the deadline


def parse(line: str) -> Job:
  """A job line: its tags ([filler], [limit=S], before the arguments) and its arguments."""
  line, filler, limit = line.strip(), False, None
  while line.startswith('['):
    tag, _, line = line[1:].partition(']')
    line = line.strip()
    if tag == 'filler':
      filler = True
    elif tag.startswith('limit=') and tag[len('limit=') :].replace('.', '', 1).isdigit():
      limit = float(tag[len('limit=') :])
    else:
      raise ValueError(f'unknown job tag [{tag}] (known: [filler], [limit=SECONDS])')
  return Job(line, filler, limit)


def job_lines(path: str) -> list[tuple[int, str]]:
  """(line number, line) of each job line of the file: blank lines and # comments skipped."""
  with open(path) as f:
    return [
      (n, line) for n, line in enumerate(f, 1) if line.strip() and not line.lstrip().startswith('#')
    ]


def _predicts(argv: list[str]) -> bool:
  """Whether the arguments ask for --predict (absl's forms: --predict, --predict=true, ...;
  the last one given counts)."""
  on = False
  for a in argv:
    if a in ('--predict', '--nopredict'):
      on = a == '--predict'
    elif a.startswith('--predict='):
      on = a.split('=', 1)[1].lower() in ('true', 't', '1', 'yes')
  return on


def command(argv: list[str], out: str, progress: str) -> list[str]:
  """The job's jaxbench command: results to OUT/results.jsonl, its progress file (a run's result
  so far; a --predict's, the card it is searching: session 10 lost four predictions' compiles,
  killed in a compile at the deadline before they wrote a thing), aimed by the queue's results
  so far."""
  results = os.path.join(out, 'results.jsonl')
  return [
    sys.executable,
    '-m',
    'jaxbench.main',
    f'--output={results}',
    f'--progress_file={progress}',
    *with_hints(argv, results),
  ]


def stop(proc: subprocess.Popen, grace_s: float = GRACE_S, dump_s: float = DUMP_S) -> tuple:
  """End a job at the deadline; returns its exit status and whether it had to be killed.

  SIGUSR1 (its stacks into the log), SIGINT (jaxbench writes its result so far, status
  'interrupted', and exits 130), and if it is still alive grace_s later, SIGUSR1 again (where
  it is stuck) and SIGKILL. SIGINT is sent dump_s after the SIGUSR1, not with it: the dump
  comes whole before the interrupt's output, and the SIGINT does not arrive while the SIGUSR1
  is still pending on the main thread (the kernel would then hand it to another thread).
  """
  usr1 = getattr(signal, 'SIGUSR1', None)
  for sig, wait_s in ((usr1, dump_s), (signal.SIGINT, grace_s), (usr1, dump_s)):
    if sig is None:
      continue
    proc.send_signal(sig)  # nothing once it has exited
    try:
      return proc.wait(timeout=wait_s), False
    except subprocess.TimeoutExpired:
      pass
  proc.kill()
  return proc.wait(), True


def recover(progress: str, results: str, how: str) -> bool:
  """Append a killed job's last progress record (jaxbench --progress_file) to the results.

  The record is whole (jaxbench replaces the file in one rename) and says what the job had
  found: status 'interrupted', its search trials so far. `how` heads its error. Returns
  whether there was one.
  """
  record = report.read_json(progress)
  if record is None:
    return False
  record['error'] = f'{how}; {record.get("error") or ""}'.rstrip('; ')
  report.append_jsonl(results, record)  # one whole line, never a torn one
  report.discard(progress)
  return True


def main(argv: list[str]) -> None:
  jobs_file, out, deadline_s = argv[1], argv[2], float(argv[3])
  gpus = int(argv[4]) if len(argv) > 4 else 1
  slots = int(argv[5]) if len(argv) > 5 else 1
  start = time.monotonic()
  os.makedirs(out, exist_ok=True)
  try:
    queue = [parse(line) for _, line in job_lines(jobs_file)]
  except ValueError as e:
    sys.exit(f'gpu_queue: {jobs_file}: {e}')
  runs = [job.args for job in queue if not _predicts(shlex.split(job.args))]
  if slots > 1 and runs:
    sys.exit(f'gpu_queue: {slots} jobs a GPU are for --predict jobs only; this one runs: {runs[0]}')
  lock = threading.Lock()
  summary = []
  mains_left = [sum(not job.filler for job in queue)]
  has_mains = mains_left[0] > 0  # fillers alone run as ordinary jobs
  mains_done = threading.Event()  # set once every job that is not a filler has ended

  def wait(proc: subprocess.Popen, left: float, filler: bool) -> int:
    """The job's exit status; TimeoutExpired at the deadline, or for a filler once every
    other job has ended."""
    if not filler or not has_mains:
      return proc.wait(timeout=left)
    end = time.monotonic() + left
    while not mains_done.is_set():
      try:
        return proc.wait(timeout=max(0.0, min(1.0, end - time.monotonic())))
      except subprocess.TimeoutExpired:
        if time.monotonic() >= end:
          raise
    raise subprocess.TimeoutExpired(proc.args, left)

  def ended(filler: bool) -> None:
    if not filler:
      with lock:
        mains_left[0] -= 1
        if not mains_left[0]:
          mains_done.set()

  def worker(gpu: int) -> None:
    while True:
      with lock:
        if not queue:
          return
        index = len(summary)
        args, filler, limit_s = queue.pop(0)
        summary.append(None)
      left = deadline_s - (time.monotonic() - start)
      if left < MIN_START_S or (filler and mains_done.is_set()):
        why = 'deadline' if left < MIN_START_S else 'the other jobs had ended'
        summary[index] = f'{index:02d} gpu{gpu} not started ({why}): {args}'
        ended(filler)
        continue
      log = os.path.join(out, f'job{index:02d}.log')
      progress = os.path.join(out, f'job{index:02d}.progress.json')
      cmd = command(shlex.split(args), out, progress)
      env = {**os.environ, 'CUDA_VISIBLE_DEVICES': str(gpu), 'PYTHONUNBUFFERED': '1'}
      if slots > 1:  # compile-only jobs sharing the GPU: memory as their autotuning needs it
        env['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'
        env['XLA_PYTHON_CLIENT_MEM_FRACTION'] = f'{SHARED_FRACTION / slots:.4f}'
      t0 = time.monotonic()
      with open(log, 'w') as f:
        f.write(f'# gpu{gpu}: {shlex.join(cmd)}\n')
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        limited = limit_s is not None and limit_s < left
        try:
          rc = wait(proc, limit_s if limited else left, filler)
        except subprocess.TimeoutExpired:
          when = f'at its limit of {limit_s:g} s' if limited else 'at the deadline'
          if filler and mains_done.is_set():
            when = 'as the other jobs had ended'
          # SIGINT makes jaxbench write its result so far (status 'interrupted'); a job that
          # does not exit within GRACE_S is killed, its thread stacks in its log (see stop).
          rc, killed = stop(proc)
          if killed:
            kept = recover(
              progress,
              os.path.join(out, 'results.jsonl'),
              f'killed {when}, no exit {GRACE_S} s after SIGINT',
            )
            rc = (
              f'{rc} (cut {when}; no exit {GRACE_S} s after SIGINT, killed; '
              f'Python thread stacks at the SIGINT and before the kill in {log}; '
              + ('its trials so far appended to the results)' if kept else 'no progress file)')
            )
          else:
            rc = f'{rc} (cut {when})'
      ended(filler)
      kind = ' filler' if filler else ''
      summary[index] = f'{index:02d} gpu{gpu}{kind} rc={rc} {time.monotonic() - t0:.0f}s: {args}'
      print(summary[index], flush=True)

  # The GPUs' clocks, power, temperature and throttle reasons once a second, to explain a run's
  # spread (two bf16 runs beside a job on the other GPU varied 16-27% between windows).
  monitor = None
  if shutil.which('nvidia-smi'):
    query = 'timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,'
    query += 'clocks_throttle_reasons.active'
    with open(os.path.join(out, 'gpu_monitor.csv'), 'w') as f:
      monitor = subprocess.Popen(
        ['nvidia-smi', f'--query-gpu={query}', '--format=csv', '-l', '1'], stdout=f, stderr=f
      )
  threads = [threading.Thread(target=worker, args=(g,)) for g in range(gpus) for _ in range(slots)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  if monitor is not None:
    monitor.terminate()
  with open(os.path.join(out, 'summary.txt'), 'w') as f:
    f.write('\n'.join(s for s in summary if s) + '\n')
  print('\n'.join(s for s in summary if s and 'not started' in s))
  results_path = os.path.join(out, 'results.jsonl')
  if os.path.isfile(results_path):
    # The results as the table rows and search chains of docs/results/ (scripts/summarize.py).
    here = os.path.dirname(os.path.abspath(__file__))
    rows = subprocess.run(
      [sys.executable, os.path.join(here, 'summarize.py'), results_path],
      capture_output=True,
      text=True,
    )
    with open(os.path.join(out, 'summary.md'), 'w') as f:
      f.write(rows.stdout + rows.stderr)
    print(rows.stdout + rows.stderr)


if __name__ == '__main__':
  main(sys.argv)
