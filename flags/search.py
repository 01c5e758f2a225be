"""Flags of the max-batch search and of device memory."""

from absl import flags

MEMORY_LIMIT_GB = flags.DEFINE_float(
  'memory_limit_gb',
  None,
  'Behave as on a card with this much memory (GB, 1e9 bytes). On a GPU '
  'it caps JAX\'s allocator before JAX starts; on the CPU it bounds the compile-time predicted '
  'peak.',
)
REMAT = flags.DEFINE_bool(
  'remat',
  False,
  'Allow XLA\'s rematerialization pass, which recomputes activations to fit '
  'oversize programs. Off by default: the max batch means "without recomputation".',
)
VERIFY_PREDICTED_OOM = flags.DEFINE_bool(
  'verify_predicted_oom',
  False,
  'Also run the batches whose predicted peak exceeds the budget, '
  'to see them fail for real (slower; proves the compile-time forecast).',
)
SEARCH_TOLERANCE = flags.DEFINE_float(
  'search_tolerance',
  0.0,
  'Stop the search once the largest fitting and the smallest failing batch are '
  'within this fraction of the former (e.g. 0.01); 0 searches to one example. Where XLA\'s '
  'memory plan is not monotone in the batch (seen on transformer_big) the last probes of an exact '
  'search chase noise; a tolerance saves those compiles and the result records it.',
)
SEARCH_HINTS = flags.DEFINE_list(
  'search_hints',
  [],
  'Result files (JSON Lines, e.g. an earlier --output or a sweep store) whose trials of the same '
  'workload, precision, config, JAX version, XLA flags and device kind give predicted peaks to aim '
  'the search with. The search still compiles and runs both sides of the boundary itself.',
)
SEARCH_RESUME = flags.DEFINE_bool(
  'search_resume',
  False,
  'Go on from the trials in --search_hints of earlier runs of the same program under the same '
  'memory (the same workload, precision, config, JAX version, XLA flags, device kind, '
  '--memory_limit_gb and device pool): their fits and out-of-memory outcomes decide, each kept '
  'with the time of its run, so that a search whose compiles take minutes can span several '
  'processes. The batch found is compiled and run again before it is timed. With --predict, '
  'every earlier forecast of the same program compiled the same way (on the device, or for the '
  'same --compile_for target) is known at any card\'s cap, and only what those leave open is '
  'compiled.',
)
RUN_EVERY_FIT = flags.DEFINE_bool(
  'run_every_fit',
  True,
  'Run two steps of every probe whose forecast fits, as it is found. With --norun_every_fit a '
  'fit is decided by its forecast and only the largest one runs, once the search has closed in '
  'on it. Should it fail, the forecast was wrong there: the search goes on below it and every '
  'later fit runs as it is found. For workloads whose first step costs minutes of host work at '
  'every new batch (bf16 nasnet_large and deeplabv3 on the H200).',
)
MAX_EXAMPLES = flags.DEFINE_integer(
  'max_examples', 1 << 20, 'Stop the search at this many examples per batch.'
)
COMPILATION_CACHE_DIR = flags.DEFINE_string(
  'compilation_cache_dir',
  None,
  'Persistent XLA compilation cache. Off by default so that '
  'compile times are real compiles; cached compiles are much faster.',
)
AUTOTUNE_LEVEL = flags.DEFINE_integer(
  'autotune_level',
  None,
  "XLA's GEMM and convolution autotuning level (--xla_gpu_autotune_level): 0 off, 1 time the "
  'candidates, 2 and 3 also initialize their buffers, 4 (XLA\'s default) also checks each '
  "candidate's result against a reference. Unset: XLA's default. Recorded in the result's "
  'xla_flags.',
  lower_bound=0,
  upper_bound=4,
)
PROBE_AUTOTUNE_LEVEL = flags.DEFINE_integer(
  'probe_autotune_level',
  None,
  "Search with compile-only probes whose convolutions and matmuls XLA autotunes at this level "
  '(0: not at all), then compile the batch they find with the run\'s own autotuning and run '
  'it: one autotuned compile instead of one a probe, for convolution networks whose autotuning '
  'at full-memory batches takes many minutes. The probes\' out-of-memory bound stands only if '
  'both compiles forecast the same bytes at that batch (checked, and in the result); otherwise '
  'the search goes on autotuned. Not with --batch_size, --predict, --search_resume or '
  '--verify_predicted_oom.',
  lower_bound=0,
  upper_bound=4,
)
AUTOTUNE_CACHE_DIR = flags.DEFINE_string(
  'autotune_cache_dir',
  None,
  "Keep XLA's GEMM and convolution autotuning results in this directory "
  '(--xla_gpu_per_fusion_autotune_cache_dir), each as it is found, and reuse them: a later '
  'compile of the same operation on the same kind of GPU skips its autotuning, even across '
  'processes and after a killed compile. A cached choice is one a fresh autotuning could have '
  'made, so results with and without it aim each other\'s searches (--search_hints).',
)
AUTOTUNE_LOG = flags.DEFINE_string(
  'autotune_log',
  None,
  "Write XLA's autotuning log here (--xla_gpu_dump_autotune_logs_to; text when the name ends in "
  '.txt): every convolution and matmul autotuned in the last compile, each candidate it timed '
  'and that candidate\'s run time (scripts/autotune_log.py sums it up). For finding where a '
  "compile's time goes; it does not change the compiled program.",
)
TRITON_GEMM = flags.DEFINE_bool(
  'triton_gemm',
  False,
  'Let XLA autotune Triton kernels for matmuls besides cuBLAS. Off by '
  'default: it multiplies compile times, and the search compiles many times.',
)
