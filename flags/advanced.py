"""Flags of the search's and the compiler's inner workings, for experiments and long runs.

Their defaults are what a benchmark run wants; --helpfull lists them, --helpshort does not.
"""

from absl import flags

from flags import validators
from jaxbench import cli

REMAT = flags.DEFINE_bool(
  'remat',
  False,
  'Let XLA\'s rematerialization pass recompute activations to fit a program in memory. Off: '
  'the largest batch is the largest without recomputation.',
)
VERIFY_PREDICTED_OOM = flags.DEFINE_bool(
  'verify_predicted_oom',
  False,
  'Also run the batches whose predicted peak exceeds the memory, to see them fail for real.',
)
SEARCH_TOLERANCE = flags.DEFINE_float(
  'search_tolerance',
  cli.SEARCH_TOLERANCE,
  'Stop the search once the largest batch that fits and the smallest that fails are within '
  'this fraction of the former, or one example apart; 0 searches to one example.',
)
validators.fraction(SEARCH_TOLERANCE)
SEARCH_HINTS = flags.DEFINE_list(
  'search_hints',
  [],
  'Result files (JSON Lines, comma-separated) whose trials of the same program aim the search '
  'with their predicted peaks (under another JAX version only where none of this one match); '
  'the search still compiles and runs both sides of the boundary.',
)
SEARCH_RESUME = flags.DEFINE_bool(
  'search_resume',
  False,
  'Go on from the trials in --search_hints of the same program under the same memory: their '
  'fits and out-of-memory outcomes count as decided. Needs --search_hints.',
)
RUN_EVERY_FIT = flags.DEFINE_bool(
  'run_every_fit',
  True,
  'Run two steps of every batch predicted to fit, as it is found. With --norun_every_fit only '
  'the largest runs, for workloads whose first step at each new batch costs minutes.',
)
MAX_EXAMPLES = flags.DEFINE_integer(
  'max_examples', 1 << 20, 'Stop the search at this many examples per batch.', lower_bound=1
)
COMPILATION_CACHE_DIR = flags.DEFINE_string(
  'compilation_cache_dir',
  None,
  'Keep compiled programs in this directory and load them from it. Off by default, so that '
  'compile times are those of real compiles.',
)
AUTOTUNE_LEVEL = flags.DEFINE_integer(
  'autotune_level',
  None,
  'XLA\'s GEMM and convolution autotuning level on a GPU (--xla_gpu_autotune_level, 0 = off, '
  '4 = XLA\'s default). Default: XLA\'s.',
  lower_bound=0,
  upper_bound=4,
)
PROBE_AUTOTUNE_LEVEL = flags.DEFINE_integer(
  'probe_autotune_level',
  None,
  'Search with compile-only probes autotuned at this level (0 = not at all), then compile and '
  'run the batch found with the run\'s own autotuning. Not with --batch_size, --predict, '
  '--search_resume or --verify_predicted_oom.',
  lower_bound=0,
  upper_bound=4,
)
AUTOTUNE_CACHE_DIR = flags.DEFINE_string(
  'autotune_cache_dir',
  None,
  'Keep XLA\'s GEMM and convolution autotuning results in this directory and reuse them, '
  'across processes (--xla_gpu_per_fusion_autotune_cache_dir).',
)
AUTOTUNE_LOG = flags.DEFINE_string(
  'autotune_log',
  None,
  'Write XLA\'s autotuning log of the last compile to this file, as text if the name ends in '
  '.txt (--xla_gpu_dump_autotune_logs_to).',
)
TRITON_GEMM = flags.DEFINE_bool(
  'triton_gemm',
  False,
  'Let XLA autotune Triton kernels for matmuls besides cuBLAS. Off: it multiplies compile times.',
)
PROGRESS_FILE = flags.DEFINE_string(
  'progress_file',
  None,
  'Keep the result so far in this file (status "interrupted", the search trials up to now), '
  'replaced as the run goes and removed once the run has written its result.',
)
