"""Flags that train a workload for a number of steps, with checkpoints to resume from."""

from absl import flags

TRAIN_STEPS = flags.DEFINE_integer(
  'train_steps',
  None,
  'Train the --model workload for this many steps (at --batch_size, or at the max batch the '
  'search finds) instead of timing it; with --checkpoint_dir, a run resumes where the last '
  'saved one ended.',
  lower_bound=1,
)
CHECKPOINT_DIR = flags.DEFINE_string(
  'checkpoint_dir',
  None,
  'Save the whole train state here with Orbax (e.g. a mounted drive) and resume from its last '
  'good checkpoint; a checkpoint of another workload, config, batch, precision or seed is '
  'refused.',
)
CHECKPOINT_EVERY = flags.DEFINE_integer(
  'checkpoint_every',
  100,
  'Save a checkpoint every this many steps (asynchronously), and at SIGTERM or SIGINT.',
  lower_bound=1,
)
CHECKPOINT_KEEP = flags.DEFINE_integer(
  'checkpoint_keep', 3, 'Keep the last this many checkpoints.', lower_bound=1
)
LOG_EVERY = flags.DEFINE_integer(
  'log_every',
  10,
  'Print the loss every this many steps; these points are the loss curve of the result.',
  lower_bound=1,
)
DATA = flags.DEFINE_enum(
  'data',
  'synthetic',
  ['synthetic', 'tfds'],
  'Where a --train_steps run reads its batches: synthetic (built on the device) or tfds (the '
  "workload's dataset through tensorflow-datasets, the extra jaxbench[data], with the "
  "original's preprocessing, prepared ahead on the host; the result says whether input was "
  'the bottleneck). The timing runs read synthetic batches only.',
)
DATA_DIR = flags.DEFINE_string(
  'data_dir',
  None,
  "With --data=tfds: TFDS's data directory holding the prepared dataset (default: "
  "$TFDS_DATA_DIR or ~/tensorflow_datasets).",
)
