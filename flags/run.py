"""Flags that choose what to run and how long to time it."""

from absl import flags

MODEL = flags.DEFINE_list('model', [], 'Workload(s) to run, comma-separated; see --list_models.')
LIST_MODELS = flags.DEFINE_bool(
  'list_models', False, 'List the workloads (name, unit, description).'
)
DESCRIBE = flags.DEFINE_bool(
  'describe',
  False,
  'Print one JSON object per --model workload (name, unit, exact parameter '
  'count from jax.eval_shape, config) without running anything.',
)
CHECK = flags.DEFINE_bool(
  'check',
  False,
  'Validate the command as its run would (every flag, conflict and named file; a sweep\'s '
  'cells too), print one line and exit, building and compiling nothing: for commands queued '
  'for a GPU (scripts/check_jobs.py).',
)
BATCH_SIZE = flags.DEFINE_integer(
  'batch_size',
  None,
  'Skip the search and measure at this batch, in the workload\'s unit '
  '(images, sequences, or tokens = max_tokens for translation).',
)
PRECISION = flags.DEFINE_string(
  'precision', None, 'fp32 | tf32 | bf16 | fp16. Default: the 2020 benchmark\'s per workload.'
)
WARMUP_STEPS = flags.DEFINE_integer('warmup_steps', 3, 'Untimed steps before timing.')
STEPS = flags.DEFINE_integer('steps', 20, 'Timed steps, split evenly over --windows.')
WINDOWS = flags.DEFINE_integer('windows', 5, 'Timed windows; the median and spread are over them.')
SEED = flags.DEFINE_integer('seed', 0, 'Seed of parameters and synthetic batches.')
TINY = flags.DEFINE_bool(
  'tiny', None, 'Run the test-size preset. Default: off on a GPU, on without one.'
)
SET = flags.DEFINE_multi_string(
  'set',
  [],
  'Override a workload config key, KEY=VALUE (repeatable), e.g. --set=src_len=40 --set=tgt_len=40.',
)
OUTPUT = flags.DEFINE_string('output', None, 'Append each result as one JSON line to this file.')
PROGRESS_FILE = flags.DEFINE_string(
  'progress_file',
  None,
  'Keep the result so far in this file: the whole record (status interrupted, the search '
  'trials up to now), replaced after each trial and change of phase, removed once the run has '
  'written its result. What a run killed before it could write had found '
  '(scripts/gpu_queue.py appends it to the results of a job it had to kill).',
)
