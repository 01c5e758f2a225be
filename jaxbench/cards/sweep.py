"""Sweeps: workloads x GPUs x precisions, each cell in a fresh process, resumable.

The memory cap must be set before JAX starts, so every cell (or, for --predict, every
workload-precision group of cards) runs as `python -m jaxbench.main ... --output=STORE`, which
appends its results whole (records.append_jsonl). The parent never starts JAX on the device: it
plans, launches, times out, and records a cell that ended without a result (a crash, a
timeout, a bad exit) as status 'failed'. A rerun skips every cell the store already holds, so
a sweep killed at any moment resumes with nothing lost and nothing duplicated: a child dies
with its parent (PR_SET_PDEATHSIG), and a lock (store.Lock, on the file the store's name
resolves to) keeps other writers off the store. A Ctrl-C stops the running cell, whose search
so far stays in the store as 'interrupted' (not done; it aims the rerun). The sweep's progress
lines go to stderr: its results are the store.
"""

import collections
import ctypes
import dataclasses
import datetime
import functools
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable

from jaxbench import cli
from jaxbench.cards import catalog
from jaxbench.results import records as report
from jaxbench.results import store
from models import registry


@dataclasses.dataclass(frozen=True)
class Cell:
  mode: str  # 'run' (emulated run) or 'predict'
  workload: str
  gpu: str  # catalog name
  precision: str
  tiny: bool
  overrides: tuple[tuple[str, str], ...] = ()

  @property
  def key(self) -> store.Key:
    return store.key(self.mode, self.workload, self.gpu, self.precision, self.tiny, self.overrides)

  def label(self) -> str:
    extra = ''.join(
      [
        ' tiny' if self.tiny else '',
        ' predict' if self.mode == 'predict' else '',
        ''.join(f' {k}={v}' for k, v in self.overrides),
      ]
    )
    return f'{self.workload} {self.precision} on {self.gpu}{extra}'


def plan(
  workloads: list[tuple[str, str]],
  gpus: list[str],
  precisions: list[str] | None,
  tiny: bool,
  overrides: tuple[tuple[str, str], ...],
  mode: str,
) -> list[Cell]:
  """Cells in order: workload, then precision, then GPU. workloads: (name, default precision)."""
  return [
    Cell(mode, name, gpu, p, tiny, tuple(sorted(overrides)))
    for name, default in workloads
    for p in (precisions or [default])
    for gpu in gpus
  ]


def groups(cells: list[Cell]) -> list[list[Cell]]:
  """What one process runs: one cell, or a --predict workload-precision's cards together."""
  out: dict[tuple, list[Cell]] = {}
  for c in cells:
    k = (c.workload, c.precision, c.tiny, c.overrides) if c.mode == 'predict' else c.key
    out.setdefault(k, []).append(c)
  return list(out.values())


def command(
  group: list[Cell], store_path: str, passthrough: list[str], hint_files: tuple[str, ...] = ()
) -> list[str]:
  """The jaxbench.main command line that runs one group and appends to the store.

  The store itself aims each cell's search (--search_hints): the cells already done for the
  same workload and precision on other cards forecast where this card's boundary lies.
  """
  c = group[0]
  hint = [*hint_files, *([store_path] if os.path.isfile(store_path) else [])]
  cards = (
    ['--predict', f'--gpus={",".join(x.gpu for x in group)}']
    if c.mode == 'predict'
    else [f'--gpu={c.gpu}']
  )
  return [
    sys.executable,
    '-m',
    'jaxbench.main',
    f'--model={c.workload}',
    f'--precision={c.precision}',
    '--tiny' if c.tiny else '--notiny',
    *[f'--set={k}={v}' for k, v in c.overrides],
    *cards,
    f'--output={store_path}',
    *([] if c.mode == 'predict' else [f'--progress_file={progress_path(store_path)}']),
    *[a for a in passthrough if _applies(a, c, bool(hint))],
    *([f'--search_hints={",".join(hint)}'] if hint else []),
  ]


def _applies(arg: str, cell: Cell, hinted: bool) -> bool:
  """Whether a passed-through flag applies to this cell's process: a resumed search goes on from
  the store's trials (nothing to resume from before there is a store), and --predict compiles
  only (nothing to resume or run)."""
  if arg == '--search_resume':
    return hinted and cell.mode != 'predict'
  if arg == '--norun_every_fit':
    return cell.mode != 'predict'
  return True


def progress_path(store_path: str) -> str:
  """Where a running cell keeps its result so far (jaxbench --progress_file)."""
  return store_path + '.progress'


def failure(cell: Cell, error: str, seconds: float, log_tail: str) -> dict[str, Any]:
  """The record of a cell that ended without a result of its own."""
  gpu = catalog.get(cell.gpu)
  return {
    'schema': 'jaxbench.result/1',
    'mode': cell.mode,
    'workload': cell.workload,
    'precision': cell.precision,
    'tiny': cell.tiny,
    'overrides': [list(kv) for kv in cell.overrides],
    'emulation': {**gpu.emulation(), 'how': 'sweep cell without a result'},
    'timestamp': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
    'status': 'failed',
    'error': error,
    'seconds': round(seconds, 1),
    'log_tail': log_tail,
  }


def _die_with_parent(parent: int) -> None:
  """In the child, before exec: be killed when the sweep dies, so no cell outlives it.

  A sweep killed between the fork and this call leaves no one to signal the child: the child
  finds itself re-parented already and ends at once.
  """
  try:
    ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass
  if os.getppid() != parent:
    os._exit(1)  # pylint: disable=protected-access


def _progress(*args: Any, **kwargs: Any) -> None:
  print(*args, **kwargs, file=sys.stderr, flush=True)


def _hms(seconds: float) -> str:
  m, s = divmod(int(round(seconds)), 60)
  h, m = divmod(m, 60)
  return f'{h}h{m:02d}m' if h else f'{m}m{s:02d}s'


def outcome(record: dict[str, Any] | None) -> str:
  """A few words on what a cell's result says."""
  if record is None:
    return 'no result'
  status, unit = record['status'], record.get('unit', '')
  if status == 'interrupted':
    return f"interrupted: {(record.get('error') or '')[:80]}"
  if status == 'ok' and record.get('mode') == 'predict':
    return f"predicted {record['max_batch']} {unit}"
  if status == 'ok':
    m = record.get('measurement') or {}
    rate = m.get('units_per_s') or 0
    return f"{record['max_batch']} {unit}, {rate:,.4g} {record['throughput_unit']}"
  if status == 'oom':
    return 'OOM (not one example fits)'
  return f"{status}: {(record.get('error') or '')[:80]}"


def _outdated(record: dict[str, Any]) -> bool:
  """A result of an earlier revision of its workload's program (see Workload.revision)."""
  if record.get('status') not in ('ok', 'oom') or record.get('workload') not in registry.names():
    return False
  return store.revision(record) != registry.get(record['workload']).revision


# How long a cell has, after the sweep passes it a Ctrl-C, to write its interrupted result (a
# run answers within a second: its XLA calls run in a thread, program._interruptible).
INTERRUPT_GRACE_S = 20.0


def salvage(store_path: str, done: dict[store.Key, dict[str, Any]]) -> dict[str, Any] | None:
  """The result so far that a cell left in its progress file (a sweep killed while it ran),
  appended to the store as status 'interrupted' where its cell is not done, so that its search
  trials aim the cell's rerun (the store is every cell's --search_hints); the record appended,
  if any. The progress file is removed: a cell's progress is its own."""
  so_far = report.read_json(progress_path(store_path))
  report.discard(progress_path(store_path))
  if so_far is None or store.problem({**so_far, 'status': 'interrupted'}):
    return None
  last = done.get(store.key_of(so_far))
  if last is not None and store.done(last):
    return None  # the cell wrote its result before the sweep was killed
  record = {**so_far, 'status': 'interrupted'}
  record['error'] = f'the sweep stopped while this cell ran; {so_far.get("error") or ""}'.rstrip()
  report.append_jsonl(store_path, record)
  return record


def _wait(proc: subprocess.Popen, timeout_s: float) -> tuple[int, str | None, bool]:
  """The cell's exit status, why it ended without one of its own (None), and whether the sweep
  was interrupted (Ctrl-C, SIGINT) meanwhile: then the cell gets the SIGINT too (started with
  setsid, it is out of the terminal's reach), to write its result so far, and is killed
  if it has not ended after INTERRUPT_GRACE_S or at a second Ctrl-C."""
  try:
    return proc.wait(timeout=timeout_s), None, False
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(), f'timed out after {timeout_s:g} s', False
  except KeyboardInterrupt:
    pass
  try:
    os.killpg(proc.pid, signal.SIGINT)
    return proc.wait(timeout=INTERRUPT_GRACE_S), 'interrupted (Ctrl-C)', True
  except (subprocess.TimeoutExpired, KeyboardInterrupt):
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(), 'interrupted (Ctrl-C), then killed', True


def run(
  cells: list[Cell],
  store_path: str,
  make_command: Callable[[list[Cell]], list[str]],
  timeout_s: float,
  retry_failed: bool = False,
  env: dict[str, str] | None = None,
  out: Callable[..., None] | None = None,
) -> int:
  """Run the cells the store lacks; returns the number of cells that failed or were interrupted
  this time. The caller holds the store's Lock.

  A cell is not done when the store lacks it or holds it as 'interrupted' (or with a status
  this code does not know), and, with `retry_failed`, as 'failed'. The store is read again
  before each cell, and a cell that another writer has recorded since is skipped. On a Ctrl-C
  the running cell writes its result so far ('interrupted': not done, its trials aim the
  rerun), the sweep stops and raises KeyboardInterrupt. `out` prints the progress lines
  (default: to stderr; the sweep's results are in the store).
  """
  out = out or _progress
  env = {**(os.environ if env is None else env), store.SWEEP_ENV: os.path.realpath(store_path)}
  records, warning = store.read(store_path)
  if warning:
    out(warning)
  store.end_line(store_path)  # a cut-short last line must not swallow the next result
  done = store.latest(records)
  if salvage(store_path, done):
    records = store.read(store_path)[0]
    done = store.latest(records)
  planned = collections.Counter(store.key_of(r) for r in records)
  to_run = [
    c
    for c in cells
    if c.key not in done or not store.done(done[c.key], retry_failed) or _outdated(done[c.key])
  ]
  already = len(cells) - len(to_run)
  out(f'sweep: {len(cells)} cells, {already} already in {store_path}, {len(to_run)} to run')
  log_path = store_path + '.log'
  start, finished, failed = time.monotonic(), 0, 0
  for group in groups(to_run):
    records = store.read(store_path)[0]
    before = collections.Counter(store.key_of(r) for r in records)
    latest = store.latest(records)
    for cell in [c for c in group if before[c.key] > planned[c.key]]:
      r = latest[cell.key]
      if store.done(r, retry_failed) and not _outdated(r):  # recorded by another writer
        group.remove(cell)
        finished += 1
        out(
          f'[{already + finished}/{len(cells)}] {cell.label()}: {outcome(r)} (recorded meanwhile)'
        )
    if not group:
      continue
    t0 = time.monotonic()
    label = (
      group[0].label()
      if len(group) == 1
      else (f'{group[0].label().rsplit(" on ", 1)[0]} on {",".join(c.gpu for c in group)}')
    )
    out(f'[{already + finished + 1}/{len(cells)}] {label}: ', end='')
    report.discard(progress_path(store_path))  # a cell's progress is its own
    with open(log_path, 'ab') as log:
      log.write(f'\n=== {datetime.datetime.now().isoformat(timespec="seconds")} {label}\n'.encode())
      log.flush()
      offset = log.tell()
      proc = subprocess.Popen(
        make_command(group),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=functools.partial(_die_with_parent, os.getpid()),
      )
      rc, error, interrupted = _wait(proc, timeout_s * len(group))
    seconds = time.monotonic() - t0
    if error is None:
      error = (f'killed by signal {-rc}' if rc < 0 else f'exit status {rc}') + ' without a result'
    records = store.read(store_path)[0]
    after = collections.Counter(store.key_of(r) for r in records)
    latest = store.latest(records)
    # The result so far that a cell left behind when it ended without its own, if any.
    so_far = report.read_json(progress_path(store_path)) if len(group) == 1 else None
    report.discard(progress_path(store_path))
    for i, cell in enumerate(group):
      if after[cell.key] <= before[cell.key]:
        record = failure(cell, error, seconds / len(group), _tail(log_path, offset))
        if interrupted:
          record['status'] = 'interrupted'
        if so_far is not None and not store.problem({**so_far, **record}):
          # What the cell had found (its search trials, the largest batch that ran), kept:
          # they aim the cell's search when it is retried (--search_hints reads the store).
          record = {**so_far, **record, 'error': f'{error}; {so_far.get("error") or ""}'}
        report.append_jsonl(store_path, record)
        latest[cell.key] = record
      if after[cell.key] <= before[cell.key] or not store.done(latest[cell.key]):
        failed += 1  # no result of its own; or interrupted, or a status not known: not done
      finished += 1
      elapsed = time.monotonic() - start
      left = elapsed / finished * (len(to_run) - finished)
      head = '' if i == 0 else f'[{already + finished}/{len(cells)}] {cell.label()}: '
      out(
        f'{head}{outcome(latest.get(cell.key))} ({_hms(seconds / len(group))}) | '
        f'{finished}/{len(to_run)} run, {_hms(elapsed / finished)} a cell on average, '
        f'elapsed {_hms(elapsed)}, ~{_hms(left)} left'
      )
    if interrupted:
      out(f'sweep: interrupted, {failed} failed or interrupted this run (log: {log_path})')
      raise KeyboardInterrupt
  out(f'sweep: done, {failed} failed this run' + (f' (log: {log_path})' if failed else ''))
  return failed


def _tail(path: str, offset: int, lines: int = 8) -> str:
  with open(path, 'rb') as f:
    f.seek(offset)
    text = f.read()[-4000:].decode(errors='replace')
  return '\n'.join(text.strip().splitlines()[-lines:])


def passthrough(a: cli.Args) -> list[str]:
  """The flags of this command that every cell's process gets unchanged."""
  args = [
    f'--steps={a.steps}',
    f'--windows={a.windows}',
    f'--warmup_steps={a.warmup_steps}',
    f'--seed={a.seed}',
    f'--max_examples={a.max_examples}',
    f'--search_tolerance={a.search_tolerance}',
    '--remat' if a.remat else '--noremat',
    '--triton_gemm' if a.triton_gemm else '--notriton_gemm',
    '--verify_predicted_oom' if a.verify_predicted_oom else '--noverify_predicted_oom',
  ]
  if a.autotune_level is not None:
    args.append(f'--autotune_level={a.autotune_level}')
  if a.probe_autotune_level is not None:
    args.append(f'--probe_autotune_level={a.probe_autotune_level}')
  if a.compilation_cache_dir:
    args.append(f'--compilation_cache_dir={a.compilation_cache_dir}')
  if a.autotune_cache_dir:
    args.append(f'--autotune_cache_dir={a.autotune_cache_dir}')
  if a.search_resume:
    args.append('--search_resume')
  if not a.run_every_fit:
    args.append('--norun_every_fit')
  return args


def main(a: cli.Args, gpus: list[catalog.Gpu], fail: Callable[[str], None]) -> int:
  """The sweep the command line `a` asks for; fail(message) reports a usage error (exit 2)."""
  from jaxbench.core import backend  # pylint: disable=g-import-not-at-top

  env = dict(os.environ)  # the cells start from the caller's environment
  tiny = a.tiny if a.tiny is not None else backend.gpu_total_bytes() is None
  # This process only plans and waits: importing the models must not claim the GPU.
  os.environ['JAX_PLATFORMS'] = 'cpu'
  try:
    p = cli.plan(a)
  except cli.UsageError as e:
    fail(str(e))
  cells = plan(
    [(w.name, w.default_precision) for w in p.workloads],
    [g.name for g in gpus],
    list(dict.fromkeys(a.precisions)) or None,
    tiny,
    p.options.overrides,
    'predict' if a.predict else 'run',
  )
  if a.check:
    print(f'jaxbench: ok: the flags are valid for a sweep of {len(cells)} cells')
    return 0
  make = functools.partial(
    command,
    store_path=os.path.abspath(a.store),
    passthrough=passthrough(a),
    hint_files=tuple(os.path.abspath(x) for x in a.search_hints),
  )
  try:
    with store.Lock(a.store):
      failed = run(cells, a.store, make, a.cell_timeout_s, a.retry_failed, env)
  except store.Busy as e:
    fail(str(e))
  except KeyboardInterrupt:
    return 130  # the shell's status for a command stopped by SIGINT
  return 1 if failed else 0
