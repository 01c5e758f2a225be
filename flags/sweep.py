"""Flags of GPU emulation, compile-only prediction and sweeps over workloads x GPUs x precisions."""

from absl import flags

GPU = flags.DEFINE_string(
  'gpu',
  None,
  'Emulate this catalog GPU (e.g. rtx_2080_ti): cap the memory at the card\'s '
  'size minus what a real card loses to the driver and the CUDA context (see docs/sweep.md).',
)
MEMORY_GB = flags.DEFINE_float(
  'memory_gb',
  None,
  'Emulate a card of this many GB (GiB, as cards are sold), less the same '
  'overhead as --gpu. Excludes --gpu and --memory_limit_gb.',
)
GPUS = flags.DEFINE_list(
  'gpus',
  [],
  'GPUs to sweep or predict: catalog names and/or "lambda2020" (the eight 2020 '
  'GPUs), comma-separated.',
)
PRECISIONS = flags.DEFINE_list(
  'precisions', [], 'Precisions to sweep, e.g. fp32,bf16. Default: each workload\'s 2020 one.'
)
PREDICT = flags.DEFINE_bool(
  'predict',
  False,
  'Predict the max batch of each --gpus/--gpu card from the compile-time '
  'memory model: compile only, run no step, time nothing.',
)
COMPILE_FOR = flags.DEFINE_string(
  'compile_for',
  None,
  'With --predict: compile for this GPU (h200) on a host without one, through JAX\'s CUDA '
  'plugin, and predict from its compiler\'s memory plan (no autotuning; see '
  'jaxbench/deviceless.py). The host may have no GPU at all.',
)
STORE = flags.DEFINE_string(
  'store',
  None,
  'Sweep: run each cell in a fresh process and append its result to this JSON '
  'Lines file; a rerun skips the cells already there. The report command '
  '(jaxbench.report_main) reads it, or several result files given comma-separated.',
)
CELL_TIMEOUT_S = flags.DEFINE_integer(
  'cell_timeout_s',
  3600,
  'Sweep: a cell running longer is killed and recorded as failed '
  '(a --predict cell group gets this per GPU).',
)
RETRY_FAILED = flags.DEFINE_bool(
  'retry_failed', False, 'Sweep: run again the cells recorded as failed (crash or timeout).'
)
