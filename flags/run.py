"""Flags that choose what to run, at which precision, and how long to time it."""

from absl import flags

from flags import validators

MODEL = flags.DEFINE_list(
  'model', [], 'Workloads to run, comma-separated, or "all"; --list_models lists them.'
)
LIST_MODELS = flags.DEFINE_bool(
  'list_models', False, 'Print each workload (name, unit, description) and exit.'
)
DESCRIBE = flags.DEFINE_bool(
  'describe',
  False,
  'Print one JSON object per --model workload (unit, exact parameter count, config) and exit, '
  'building and running nothing.',
)
CHECK = flags.DEFINE_bool(
  'check',
  False,
  'Make every check the run would make (flags, conflicts, files, a sweep\'s cells), print one '
  'line and exit, building and compiling nothing.',
)
BATCH_SIZE = flags.DEFINE_integer(
  'batch_size',
  None,
  'Measure at this batch instead of searching for the largest, in the workload\'s unit '
  '(images, sequences, or tokens for translation: cut to whole sentences, in multiples of 8 '
  'for fairseq\'s workloads, as fairseq cuts --max-tokens).',
  lower_bound=1,
)
PRECISION = flags.DEFINE_enum(
  'precision',
  None,
  validators.PRECISION_NAMES,
  'Compute precision. Default: each workload\'s precision in the 2020 benchmark.',
)
WARMUP_STEPS = flags.DEFINE_integer(
  'warmup_steps', 3, 'Training steps run before timing starts, not timed.', lower_bound=0
)
STEPS = flags.DEFINE_integer(
  'steps', 20, 'Timed training steps, split evenly over --windows.', lower_bound=1
)
WINDOWS = flags.DEFINE_integer(
  'windows',
  5,
  'Timed windows; the step time reported is their median, with their spread.',
  lower_bound=1,
)
SEED = flags.DEFINE_integer(
  'seed', 0, 'Random seed of the parameters and the synthetic batches.', lower_bound=0
)
TINY = flags.DEFINE_bool(
  'tiny', None, 'Run each workload\'s test-size preset. Default: on without a GPU, off with one.'
)
SET = flags.DEFINE_multi_string(
  'set',
  [],
  'Override a key of the workload\'s config, as KEY=VALUE (e.g. --set=src_len=40; lists as '
  '--set=blocks=[3,4,6,3], booleans as true/false), checked against the key\'s range before '
  'anything is built; --describe shows the config.',
)
OUTPUT = flags.DEFINE_string(
  'output',
  None,
  'Append each result to this file as one JSON line. It is proven writable before the run; a '
  'result that cannot be written goes whole to stderr.',
)
PROFILE_DIR = flags.DEFINE_string(
  'profile_dir',
  None,
  'Write a jax.profiler trace of one window of the timed steps (run after the timed windows, '
  'so it slows no figure) into this directory; TensorBoard\'s profile plugin or Perfetto read it. '
  'The run prints, and records, that window\'s GPU time per step by kernel kind and JAX operation.',
)
