"""The sweep's store: an append-only JSON Lines file, one whole result per line.

Lines are written by report.append_jsonl (one O_APPEND write, then fsync), so a line is whole
or absent even when the writer is killed. A line that does not parse (a foreign writer cut
short, a disk that filled up) is reported once and skipped. A cell is identified by its key;
when a key appears twice (a retried failure), the last line wins.
"""

import fcntl
import json
import os
from typing import Any, Iterable

Key = tuple  # (mode, workload, gpu, precision, tiny, overrides)


def key(
  mode: str,
  workload: str,
  gpu: str | None,
  precision: str,
  tiny: bool,
  overrides: Iterable[Iterable[str]],
) -> Key:
  return (
    mode,
    workload,
    gpu,
    precision,
    bool(tiny),
    tuple(sorted(tuple(str(x) for x in kv) for kv in overrides)),
  )


def key_of(record: dict[str, Any]) -> Key:
  """The cell a stored result belongs to."""
  emu = record.get('emulation') or {}
  mode = record.get('mode', 'run')
  if (record.get('device') or {}).get('deviceless'):
    mode += ' deviceless'  # compiled for the GPU on a host without one: a prediction of its own
  return key(
    mode,
    record['workload'],
    emu.get('gpu'),
    record['precision'],
    record.get('tiny', False),
    record.get('overrides') or [],
  )


def revision(record: dict[str, Any]) -> int:
  """The workload revision a result was measured with (results from before revisions: 1)."""
  return record.get('workload_revision', 1)


def lower_bound(record: dict[str, Any]) -> bool:
  """Whether the search stopped at --max_examples with everything fitting (search.capped)."""
  return bool((record.get('search') or {}).get('capped'))


def read(path: str) -> tuple[list[dict[str, Any]], str | None]:
  """All whole results in `path` (none if it does not exist) and one warning line, if any."""
  if not os.path.exists(path):
    return [], None
  with open(path, 'rb') as f:
    data = f.read()
  records, bad = [], []
  lines = data.split(b'\n')
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
      key_of(record)
    except (ValueError, KeyError, TypeError, AttributeError):
      bad.append(number)
      continue
    records.append(record)
  warning = None
  if bad:
    trailing = bad == [len(lines) if lines[-1].strip() else len(lines) - 1]
    listed = ', '.join(map(str, bad[:5])) + (', ...' if len(bad) > 5 else '')
    where = f'its last line ({bad[0]})' if trailing else f'line(s) {listed}'
    warning = f'warning: store {path}: {where} is not a whole result (a write cut short?); skipped'
  return records, warning


def latest(records: Iterable[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
  """Key -> the last result recorded for it."""
  out = {}
  for r in records:
    out[key_of(r)] = r
  return out


def end_line(path: str) -> None:
  """Terminate a cut-short last line, so that the next append starts a line of its own."""
  if not os.path.exists(path) or os.path.getsize(path) == 0:
    return
  with open(path, 'rb') as f:
    f.seek(-1, os.SEEK_END)
    last = f.read(1)
  if last != b'\n':
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
      os.write(fd, b'\n')
      os.fsync(fd)
    finally:
      os.close(fd)


class Busy(RuntimeError):
  """Another sweep is writing to the same store."""


class Lock:
  """An exclusive lock on STORE.lock for the life of a sweep (released when the process dies)."""

  def __init__(self, store_path: str):
    self.path = store_path + '.lock'
    self.fd = None

  def __enter__(self):
    self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
      fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      os.close(self.fd)
      raise Busy(f'another sweep is writing to this store ({self.path} is locked)') from None
    return self

  def __exit__(self, *exc):
    fcntl.flock(self.fd, fcntl.LOCK_UN)
    os.close(self.fd)
