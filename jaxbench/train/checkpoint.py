"""A training run's checkpoints: Orbax's CheckpointManager, and the run's identity beside it.

Orbax writes each step into a temporary directory and renames it when the save is complete, so
a process killed mid-save leaves no step that looks whole; a step damaged later (a truncated
file on a flaky drive) fails to restore, is set aside as `STEP.unreadable`, and the step before
it is used. The identity (workload, config, precision, batch, seed) is a JSON file in the same
directory, read without Orbax or JAX, so that the command line can refuse a checkpoint of
another run before anything is built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

IDENTITY_FILE = 'jaxbench_train.json'
IDENTITY_SCHEMA = 'jaxbench.train_checkpoint/1'
# The identity's keys that a resumed run must share, in the order a refusal names them.
_SAME = ('workload', 'workload_revision', 'precision', 'seed', 'config', 'batch')
_UNREADABLE = '.unreadable'


class CheckpointError(Exception):
  """A checkpoint directory that this run cannot use: one line, exit status 2."""


def identity(
  workload: str, revision: int, cfg: Mapping[str, Any], precision: str, batch: int | None, seed: int
) -> dict[str, Any]:
  """What a checkpoint is of, as JSON values (tuples as lists); batch None: not decided yet."""
  return json.loads(
    json.dumps(
      {
        'schema': IDENTITY_SCHEMA,
        'workload': workload,
        'workload_revision': revision,
        'precision': precision,
        'seed': seed,
        'config': dict(cfg),
        'batch': batch,
      }
    )
  )


def read_identity(directory: str) -> dict[str, Any] | None:
  """The identity stored in `directory`, or None where there is none."""
  path = os.path.join(directory, IDENTITY_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      found = json.load(f)
  except (OSError, UnicodeError, ValueError) as e:
    raise CheckpointError(f'cannot read {path}: {getattr(e, "strerror", None) or e}') from None
  if not isinstance(found, dict) or found.get('schema') != IDENTITY_SCHEMA:
    raise CheckpointError(f'{path} is not the identity of a jaxbench training run')
  return found


def write_identity(directory: str, ident: Mapping[str, Any]) -> None:
  """Store the identity, whole or not at all (written beside, then renamed)."""
  path = os.path.join(directory, IDENTITY_FILE)
  with open(path + '.tmp', 'w') as f:
    json.dump(ident, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(path + '.tmp', path)


def mismatch(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
  """How the stored identity differs from this run's, in words, or None; a batch of None in
  `wanted` (a search not yet run) agrees with any."""
  for key in _SAME:
    have, want = found.get(key), wanted.get(key)
    if key == 'batch' and want is None:
      continue
    if have == want:
      continue
    if key == 'config' and isinstance(have, dict) and isinstance(want, dict):
      keys = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
      shown = ', '.join(f'{k}={_text(have.get(k))}, not {_text(want.get(k))}' for k in keys)
      return f'config {shown}'
    return f'{key} {_text(have)}, not {_text(want)}'
  return None


def _text(value: Any) -> str:
  return value if isinstance(value, str) else json.dumps(value, separators=(',', ':'))


def refusal(directory: str, found: Mapping[str, Any], wanted: Mapping[str, Any]) -> str | None:
  """The one line that refuses `directory` for this run, or None where it may resume from it."""
  differs = mismatch(found, wanted)
  if differs is None:
    return None
  return f'{directory} holds checkpoints of another run ({differs}): give another --checkpoint_dir'


def unusable(directory: str, unwritable_dir: Callable[[str], str | None]) -> str | None:
  """Why `directory` cannot hold this run's checkpoints, or None. It need not exist: its
  nearest existing parent must then take new files. Nothing is left behind."""
  path = os.path.abspath(directory)
  if os.path.exists(path):
    if not os.path.isdir(path):
      return f'{directory} is not a directory'
    if os.listdir(path) and not os.path.exists(os.path.join(path, IDENTITY_FILE)):
      return f'{directory} is not empty and holds no jaxbench checkpoint'
    return unwritable_dir(path)
  parent = os.path.dirname(path)
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return f'{parent} is not a directory'
  return unwritable_dir(parent)


class Checkpoints:
  """The steps saved in one directory: asynchronous saves, the last `keep` kept, restores that
  fall back past a damaged step. Each step holds a tree of arrays and a JSON record."""

  def __init__(self, directory: str, keep: int, log: Callable[[str], None] = print):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    self._ocp = ocp
    self.directory = os.path.abspath(directory)
    self._log = log
    self._manager = ocp.CheckpointManager(
      self.directory,
      options=ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        create=True,
        enable_async_checkpointing=True,
        # What a kill mid-save left: a temporary directory, never a step.
        cleanup_tmp_directories=True,
      ),
      item_names=('arrays', 'record'),
    )

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, arrays: Any, record: Mapping[str, Any]) -> None:
    """Start saving `step`; returns once the arrays are copied off the device, the writing
    goes on in the background (a save still writing is waited for first)."""
    ocp = self._ocp
    self._manager.save(
      step,
      args=ocp.args.Composite(
        arrays=ocp.args.StandardSave(arrays), record=ocp.args.JsonSave(dict(record))
      ),
      force=True,
    )

  def saving(self) -> bool:
    """Whether a save is still being written."""
    return bool(self._manager.is_saving_in_progress())

  def restore_latest(self, template: Any) -> tuple[int, Any, dict[str, Any]] | None:
    """The newest step that restores whole (step, arrays shaped and placed as `template`,
    record), or None where no step is saved. A step that fails is renamed STEP.unreadable and
    the next older one tried."""
    ocp = self._ocp
    for step in reversed(self.steps()):
      try:
        restored = self._manager.restore(
          step,
          args=ocp.args.Composite(
            arrays=ocp.args.StandardRestore(template), record=ocp.args.JsonRestore()
          ),
        )
        record = restored['record']
        if not isinstance(record, dict) or record.get('step') != step:
          raise ValueError(f'its record is not of step {step}')
        return step, restored['arrays'], record
      except Exception as e:  # pylint: disable=broad-except  (any damage: fall back)
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        aside = os.path.join(self.directory, f'{step}{_UNREADABLE}')
        os.replace(os.path.join(self.directory, str(step)), aside)
        self._manager.reload()
        self._log(
          f'jaxbench: warning: checkpoint step {step} is unreadable ({why}): set aside as {aside}'
        )
    return None

  def wait(self) -> None:
    """Until every save has been written (and its step renamed into place)."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
