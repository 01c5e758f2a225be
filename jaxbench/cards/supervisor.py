"""The sweep's child-process supervisor: die with the sweep, timeout, Ctrl-C, failure records."""

import ctypes
import dataclasses
import datetime
import functools
import os
import signal
import subprocess
from typing import Any

from jaxbench.cards import catalog, grid
from jaxbench.core import interrupt
from jaxbench.results import records as report
from jaxbench.results import store

# How long a cell has, after the sweep passes it a Ctrl-C, to write its interrupted result (a
# run answers within a second: its XLA calls run in a thread, program._interruptible).
INTERRUPT_GRACE_S = 20.0


@dataclasses.dataclass(frozen=True)
class Ended:
  """How a cell's process ended."""

  error: str  # why it ended, should it have left no result of its own
  interrupted: bool  # the sweep was interrupted (Ctrl-C) while it ran
  log_path: str  # the sweep's log, where its output went
  log_offset: int  # where its output starts there


def launch(
  command: list[str], log_path: str, label: str, env: dict[str, str], timeout_s: float
) -> Ended:
  """Run one cell's process to its end, its output appended to the log under a line naming it."""
  with open(log_path, 'ab') as log:
    log.write(f'\n=== {datetime.datetime.now().isoformat(timespec="seconds")} {label}\n'.encode())
    log.flush()
    offset = log.tell()
    proc = subprocess.Popen(
      command,
      stdout=log,
      stderr=subprocess.STDOUT,
      env=env,
      start_new_session=True,
      preexec_fn=functools.partial(die_with_parent, os.getpid()),
    )
    rc, error, interrupted = wait(proc, timeout_s)
  if error is None:
    error = (f'killed by signal {-rc}' if rc < 0 else f'exit status {rc}') + ' without a result'
  return Ended(error, interrupted, log_path, offset)


def die_with_parent(parent: int) -> None:
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


def wait(proc: subprocess.Popen, timeout_s: float | None) -> tuple[int, str | None, bool]:
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
    interrupt.taken()
  try:
    os.killpg(proc.pid, signal.SIGINT)
    return proc.wait(timeout=INTERRUPT_GRACE_S), 'interrupted (Ctrl-C)', True
  except (subprocess.TimeoutExpired, KeyboardInterrupt):
    interrupt.taken()
    os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(), 'interrupted (Ctrl-C), then killed', True


def left_behind(store_path: str, one_cell: bool) -> dict[str, Any] | None:
  """The result so far that a process left in its progress file, where it ran one cell (a
  process of several cells keeps none). The file is removed: a cell's progress is its own."""
  so_far = report.read_json(grid.progress_path(store_path)) if one_cell else None
  report.discard(grid.progress_path(store_path))
  return so_far


def record_failure(
  store_path: str,
  cell: grid.Cell,
  ended: Ended,
  seconds: float,
  so_far: dict[str, Any] | None,
) -> dict[str, Any]:
  """Append to the store the record of a cell that ended without a result of its own ('failed',
  or 'interrupted' after a Ctrl-C); the record appended."""
  record = failure(cell, ended.error, seconds, _tail(ended.log_path, ended.log_offset))
  if ended.interrupted:
    record['status'] = 'interrupted'
  if so_far is not None and not store.problem({**so_far, **record}):
    # What the cell had found (its search trials, the largest batch that ran), kept:
    # they aim the cell's search when it is retried (--search_hints reads the store).
    record = {**so_far, **record, 'error': f'{ended.error}; {so_far.get("error") or ""}'}
  report.append_jsonl(store_path, record)
  return record


def failure(cell: grid.Cell, error: str, seconds: float, log_tail: str) -> dict[str, Any]:
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


def salvage(store_path: str, done: dict[store.Key, dict[str, Any]]) -> dict[str, Any] | None:
  """The result so far that a cell left in its progress file (a sweep killed while it ran),
  appended to the store as status 'interrupted' where its cell is not done, so that its search
  trials aim the cell's rerun (the store is every cell's --search_hints); the record appended,
  if any. The progress file is removed: a cell's progress is its own."""
  so_far = report.read_json(grid.progress_path(store_path))
  report.discard(grid.progress_path(store_path))
  if so_far is None or store.problem({**so_far, 'status': 'interrupted'}):
    return None
  last = done.get(store.key_of(so_far))
  if last is not None and store.done(last):
    return None  # the cell wrote its result before the sweep was killed
  record = {**so_far, 'status': 'interrupted'}
  record['error'] = f'the sweep stopped while this cell ran; {so_far.get("error") or ""}'.rstrip()
  report.append_jsonl(store_path, record)
  return record


def _tail(path: str, offset: int, lines: int = 8) -> str:
  with open(path, 'rb') as f:
    f.seek(offset)
    text = f.read()[-4000:].decode(errors='replace')
  return '\n'.join(text.strip().splitlines()[-lines:])
