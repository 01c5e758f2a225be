"""The sweep's store: an append-only JSON Lines file, one whole result per line.

Lines are written by report.append_jsonl (one O_APPEND write, then fsync), so a line is whole
or absent even when the writer is killed. read() is the one reader of results: a line that is
not a result (a foreign writer cut short, a disk that filled up, a hand edit, another file) is
reported with its file and line number and skipped. A cell is identified by its key; when a
key appears twice (a retried failure, an interrupted search and its rerun), the last line wins.
Lock keeps a sweep and other writers off one store.
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
  if record.get('framework', 'jax') != 'jax':  # a PyTorch peer's run: a cell beside JAX's
    mode += f" {record['framework']}" + (' compiled' if record.get('torch_compile') else '')
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


# The statuses whose cell a sweep does not run again (a 'failed' one it does with
# --retry_failed). Not done: 'interrupted' (a Ctrl-C, a sweep stopped mid-cell) and a status this
# code does not know (a newer writer's).
DONE = ('ok', 'oom', 'invalid', 'error', 'failed')
# The fields that hold an object (or null) wherever they appear.
_OBJECTS = ('config', 'device', 'emulation', 'memory', 'measurement', 'search', 'params')

_MAX_REPORTED = 5  # bad lines named one by one in a warning; the rest are counted


def _is_int(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def problem(record: Any) -> str | None:
  """What makes `record` not a result the readers can use (None if nothing): the fields that the
  sweep, the hints and the report index without checking must be there with their types."""
  if not isinstance(record, dict):
    return f'not a JSON object but {type(record).__name__}'
  for name in ('workload', 'status', 'precision'):
    if name not in record:
      return f'no {name!r}'
    if not isinstance(record[name], str) or not record[name]:
      return f'{name!r} is not a name: {record[name]!r}'
  typed = {
    'mode': (str,),
    'tiny': (bool, type(None)),
    'overrides': (list, type(None)),
    'workload_revision': (int,),
    'timestamp': (str, type(None)),
    'unit': (str,),
    'throughput_unit': (str,),
    'error': (str, type(None)),
    **{k: (dict, type(None)) for k in _OBJECTS},
  }
  for name, types in typed.items():
    value = record.get(name)
    if name in record and (
      not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
    ):
      return f'{name!r} is not a {"/".join(t.__name__ for t in types if t is not type(None))}'
  for kv in record.get('overrides') or []:
    if not isinstance(kv, list) or len(kv) != 2:
      return f"'overrides' holds {kv!r}, not a [name, value] pair"
  if not isinstance((record.get('emulation') or {}).get('gpu'), (str, type(None))):
    return "'emulation.gpu' is not a name"
  trials = (record.get('search') or {}).get('trials')
  if not isinstance(trials, (list, type(None))):
    return "'search.trials' is not a list"
  for i, t in enumerate(trials or []):
    if not isinstance(t, dict) or not _is_int(t.get('examples')):
      return f"'search.trials' item {i} is not a trial (an object with whole 'examples')"
    peak = t.get('predicted_peak_bytes')
    if peak is not None and not _is_number(peak):
      return f"'search.trials' item {i} has a 'predicted_peak_bytes' that is not a number"
  if record['status'] in ('ok', 'invalid') and not _is_int(record.get('max_batch')):
    return f"status {record['status']!r} without a whole 'max_batch'"
  rate = (record.get('measurement') or {}).get('units_per_s')
  if rate is not None and not (_is_number(rate) and {'unit', 'throughput_unit'} <= set(record)):
    return "'measurement.units_per_s' without a number and its 'unit' and 'throughput_unit'"
  return None


def not_a_store(path: str) -> str | None:
  """Why a file given as --store cannot be read as results (no file, or no line of it a
  result), or None."""
  if not os.path.isfile(path):
    return f'no file {path}'
  if not read(path)[0]:
    return f'{path} holds no result (no line of it is a whole jaxbench result)'
  return None


def read(path: str) -> tuple[list[dict[str, Any]], str | None]:
  """All whole results in `path` (none if it does not exist) and the warning, if any: one line
  per line that is not a result (not JSON, not an object, a field the readers rely on missing
  or of another type; see problem()), each as PATH:LINE and why; they are skipped. Every
  reader of results (the sweep, --search_hints, the report) reads through here."""
  if not os.path.exists(path):
    return [], None
  with open(path, 'rb') as f:
    data = f.read()
  records, bad = [], []
  lines = data.split(b'\n')
  last = len(lines) if lines[-1].strip() else len(lines) - 1
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError:  # UnicodeDecodeError included: a binary file
      why = 'cut short (a write stopped mid-line?)' if number == last else 'not JSON'
      bad.append(f'{number}: {why}')
      continue
    why = problem(record)
    if why:
      bad.append(f'{number}: {why}')
      continue
    records.append(record)
  if not bad:
    return records, None
  shown = [f'warning: {path}:{b}; skipped' for b in bad[:_MAX_REPORTED]]
  if len(bad) > _MAX_REPORTED:
    shown.append(f'warning: {path}: {len(bad) - _MAX_REPORTED} more lines that are not results')
  return records, '\n'.join(shown)


def done(record: dict[str, Any], retry_failed: bool = False) -> bool:
  """Whether a sweep counts the cell of `record` as done (DONE; 'failed' not with retry_failed)."""
  return record['status'] in DONE and not (retry_failed and record['status'] == 'failed')


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
  """Another process is writing to the same store."""


# The store a sweep's cells append to, in their environment: they are the sweep's own writers.
SWEEP_ENV = 'JAXBENCH_SWEEP_STORE'


def lock_path(store_path: str) -> str:
  """STORE.lock beside the file `store_path` resolves to: one store has one lock, whatever the
  name (a symbolic link, a relative path) it is reached by."""
  return os.path.realpath(store_path) + '.lock'


class Lock:
  """A lock on a store for the life of a writer; the kernel's (flock), so it goes when its
  process dies, however it dies.

  A sweep takes it exclusively: it decides which cells are missing once and then appends them,
  so a second writer beside it could measure a cell it is measuring and duplicate its key. A
  single run with --output=STORE takes it shared (`shared`): runs beside one another append
  whole lines of cells each asked for, but a run does not start beside a sweep on its store, nor
  a sweep beside such a run. The sweep's own cells are single runs on its store: the sweep names
  the store in their environment (SWEEP_ENV) and their shared lock is the sweep's. A `store_path`
  of None (a run without --output) locks nothing.
  """

  def __init__(self, store_path: str | None, shared: bool = False):
    self.path = lock_path(store_path) if store_path else None
    self.shared = shared
    self.fd = None
    if shared and store_path and os.environ.get(SWEEP_ENV) == os.path.realpath(store_path):
      self.path = None  # a cell of the sweep that holds it

  def __enter__(self):
    if self.path is None:
      return self
    self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
      fcntl.flock(self.fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError:
      os.close(self.fd)
      self.fd = None
      who = 'a sweep is' if self.shared else 'another sweep, or a run with --output, is'
      raise Busy(f'{who} writing to this store ({self.path} is locked)') from None
    return self

  def __exit__(self, *exc):
    if self.fd is not None:
      fcntl.flock(self.fd, fcntl.LOCK_UN)
      os.close(self.fd)
      self.fd = None
