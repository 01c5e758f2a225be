"""The training flags, checked together and against the checkpoint directory: a Train or one
UsageError line. Imports no JAX (the command line is checked before the backend starts)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from jaxbench import cli
from jaxbench.train import checkpoint

if TYPE_CHECKING:
  from models import workload as wl


@dataclasses.dataclass(frozen=True)
class Train:
  """What a training run does besides the run's own options (batch, precision, seed)."""

  steps: int
  checkpoint_dir: str | None = None
  every: int = 100  # save every this many steps
  keep: int = 3  # the checkpoints kept
  log_every: int = 10  # a loss line, and a point of the loss curve
  data: str = 'synthetic'  # where the batches come from: 'synthetic' or 'tfds'
  data_dir: str | None = None  # TFDS's data directory (None: its default)


def check_flags(a: cli.Args) -> None:
  """The training flags against those they cannot go with; checked before the cards are."""
  if a.data_dir is not None and a.data != 'tfds':
    raise cli.UsageError('--data_dir is where --data=tfds reads: give --data=tfds')
  if a.train_steps is None:
    if a.checkpoint_dir is not None:
      raise cli.UsageError('--checkpoint_dir keeps a training run: give --train_steps')
    if a.data != 'synthetic':
      raise cli.UsageError(
        f'--data={a.data} feeds a training run: give --train_steps (timing runs read '
        'synthetic batches)'
      )
    return
  for given, what in (
    (a.gpus, '--gpus (a sweep or a prediction of many cards)'),
    (a.store, '--store (a sweep)'),
    (a.predict, '--predict (it compiles only)'),
    (a.compile_for, '--compile_for (it compiles only)'),
    (a.describe, '--describe'),
    (a.list_models, '--list_models'),
    (a.profile_dir, '--profile_dir (it traces the timed steps)'),
    (a.progress_file, '--progress_file (the checkpoints are its progress)'),
    (a.devices != '1' or a.shard_optimizer or a.scaling, '--devices (it trains on one device)'),
  ):
    if given:
      raise cli.UsageError(f'--train_steps trains one workload: not with {what}')
  if len(a.model) != 1 or a.model[0] == 'all':
    raise cli.UsageError('--train_steps trains one workload: give one --model')


def plan(a: cli.Args, w: wl.Workload, cfg: wl.Config) -> Train | None:
  """The training run the flags ask for (None: none), its checkpoint directory proven usable:
  writable, and empty or holding checkpoints of this workload, config, precision and seed
  (and batch, where --batch_size gives it)."""
  check_flags(a)
  if a.train_steps is None:
    return None
  train = Train(
    a.train_steps,
    a.checkpoint_dir,
    a.checkpoint_every,
    a.checkpoint_keep,
    a.log_every,
    a.data,
    a.data_dir,
  )
  if a.data == 'tfds':
    from jaxbench.train import recipes, tfds_data  # pylint: disable=g-import-not-at-top

    try:
      tfds_data.open_records(recipes.recipe(w.name), a.data_dir)
    except recipes.DataError as e:
      raise cli.UsageError(str(e)) from None
  if a.checkpoint_dir is None:
    return train
  problem = checkpoint.unusable(a.checkpoint_dir, cli.unwritable_dir)
  if problem:
    raise cli.UsageError(f'--checkpoint_dir: {problem}')
  from models import precision  # pylint: disable=g-import-not-at-top

  try:
    found = checkpoint.read_identity(a.checkpoint_dir)
  except checkpoint.CheckpointError as e:
    raise cli.UsageError(f'--checkpoint_dir: {e}') from None
  if found is not None:
    wanted = checkpoint.identity(
      w.name,
      w.revision,
      cfg,
      precision.get(a.precision or w.default_precision).name,
      a.batch_size,
      a.seed,
    )
    refused = checkpoint.refusal(a.checkpoint_dir, found, wanted)
    if refused:
      raise cli.UsageError(f'--checkpoint_dir: {refused}')
  return train
