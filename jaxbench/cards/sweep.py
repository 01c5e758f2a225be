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
import dataclasses
import functools
import os
import sys
import time
from typing import Any, Callable

from jaxbench import cli
from jaxbench.cards import catalog, grid, supervisor
from jaxbench.core import interrupt
from jaxbench.results import records as report
from jaxbench.results import store
from models import registry


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


@dataclasses.dataclass
class _Tally:
  """The sweep's count of cells, and its progress lines."""

  out: Callable[..., None]
  cells: int  # in the sweep
  already: int  # done before this run
  to_run: int
  start: float  # time.monotonic() when the cells began to run
  finished: int = 0  # of to_run, run or recorded meanwhile
  failed: int = 0  # failed or interrupted this run

  def recorded_meanwhile(self, cell: grid.Cell, record: dict[str, Any]) -> None:
    self.finished += 1
    self.out(
      f'[{self.already + self.finished}/{self.cells}] {cell.label()}: {outcome(record)} '
      '(recorded meanwhile)'
    )

  def starting(self, label: str) -> None:
    self.out(f'[{self.already + self.finished + 1}/{self.cells}] {label}: ', end='')

  def ended(
    self, cell: grid.Cell, first: bool, record: dict[str, Any] | None, seconds: float
  ) -> None:
    """The line of a cell that ran for `seconds`; the first of its process's cells ends the line
    that starting() began."""
    self.finished += 1
    elapsed = time.monotonic() - self.start
    left = elapsed / self.finished * (self.to_run - self.finished)
    head = '' if first else f'[{self.already + self.finished}/{self.cells}] {cell.label()}: '
    self.out(
      f'{head}{outcome(record)} ({_hms(seconds)}) | '
      f'{self.finished}/{self.to_run} run, {_hms(elapsed / self.finished)} a cell on average, '
      f'elapsed {_hms(elapsed)}, ~{_hms(left)} left'
    )


def run(
  cells: list[grid.Cell],
  store_path: str,
  make_command: Callable[[list[grid.Cell]], list[str]],
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
  done, planned = _read(store_path, out)
  to_run = [
    c
    for c in cells
    if c.key not in done or not store.done(done[c.key], retry_failed) or _outdated(done[c.key])
  ]
  already = len(cells) - len(to_run)
  out(f'sweep: {len(cells)} cells, {already} already in {store_path}, {len(to_run)} to run')
  log_path = store_path + '.log'
  tally = _Tally(out, len(cells), already, len(to_run), time.monotonic())
  for group in grid.groups(to_run):
    before = _drop_recorded(group, store_path, planned, retry_failed, tally)
    if not group:
      continue
    if _run_group(group, before, store_path, log_path, make_command, timeout_s, env, tally):
      out(f'sweep: interrupted, {tally.failed} failed or interrupted this run (log: {log_path})')
      raise KeyboardInterrupt
  out(
    f'sweep: done, {tally.failed} failed this run' + (f' (log: {log_path})' if tally.failed else '')
  )
  return tally.failed


def _read(
  store_path: str, out: Callable[..., None]
) -> tuple[dict[store.Key, dict[str, Any]], collections.Counter]:
  """The store's latest record of each cell and its count of records of each, once a progress
  file that a killed sweep left is salvaged; a warning on lines that are not results goes out."""
  records, warning = store.read(store_path)
  if warning:
    out(warning)
  store.end_line(store_path)  # a cut-short last line must not swallow the next result
  done = store.latest(records)
  if supervisor.salvage(store_path, done):
    records = store.read(store_path)[0]
    done = store.latest(records)
  return done, collections.Counter(store.key_of(r) for r in records)


def _drop_recorded(
  group: list[grid.Cell],
  store_path: str,
  planned: collections.Counter,
  retry_failed: bool,
  tally: _Tally,
) -> collections.Counter:
  """Take out of `group` the cells that another writer has recorded since the sweep planned;
  returns the store's count of records of each cell now."""
  records = store.read(store_path)[0]
  before = collections.Counter(store.key_of(r) for r in records)
  latest = store.latest(records)
  for cell in [c for c in group if before[c.key] > planned[c.key]]:
    r = latest[cell.key]
    if store.done(r, retry_failed) and not _outdated(r):  # recorded by another writer
      group.remove(cell)
      tally.recorded_meanwhile(cell, r)
  return before


def _run_group(
  group: list[grid.Cell],
  before: collections.Counter,
  store_path: str,
  log_path: str,
  make_command: Callable[[list[grid.Cell]], list[str]],
  timeout_s: float,
  env: dict[str, str],
  tally: _Tally,
) -> bool:
  """Run one process's cells and record each that it left without a result; whether the sweep
  was interrupted meanwhile."""
  t0 = time.monotonic()
  label = (
    group[0].label()
    if len(group) == 1
    else (f'{group[0].label().rsplit(" on ", 1)[0]} on {",".join(c.gpu for c in group)}')
  )
  tally.starting(label)
  report.discard(grid.progress_path(store_path))  # a cell's progress is its own
  ended = supervisor.launch(make_command(group), log_path, label, env, timeout_s * len(group))
  seconds = time.monotonic() - t0
  records = store.read(store_path)[0]
  after = collections.Counter(store.key_of(r) for r in records)
  latest = store.latest(records)
  so_far = supervisor.left_behind(store_path, one_cell=len(group) == 1)
  for i, cell in enumerate(group):
    missing = after[cell.key] <= before[cell.key]
    if missing:
      latest[cell.key] = supervisor.record_failure(
        store_path, cell, ended, seconds / len(group), so_far
      )
    if missing or not store.done(latest[cell.key]):
      tally.failed += 1  # no result of its own; or interrupted, or a status not known: not done
    tally.ended(cell, i == 0, latest.get(cell.key), seconds / len(group))
  return ended.interrupted


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
  cells = grid.plan(
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
    grid.command,
    store_path=os.path.abspath(a.store),
    passthrough=grid.passthrough(a),
    hint_files=tuple(os.path.abspath(x) for x in a.search_hints),
  )
  try:
    with store.Lock(a.store):
      failed = run(cells, a.store, make, a.cell_timeout_s, a.retry_failed, env)
  except store.Busy as e:
    fail(str(e))
  except KeyboardInterrupt:
    interrupt.taken()
    return 130  # the shell's status for a command stopped by SIGINT
  return 1 if failed else 0
