"""Flags of the card to emulate, compile-only prediction, and sweeps over workloads x GPUs."""

from absl import flags

from flags import validators
from flags.store import STORE as STORE  # --store: the sweep's file, which the report reads

GPU = flags.DEFINE_string(
  'gpu',
  None,
  'Emulate this catalog GPU (e.g. rtx_2080_ti): cap the memory at the card\'s size less what '
  'the driver and the CUDA context take on a real card.',
)
MEMORY_GB = flags.DEFINE_float(
  'memory_gb',
  None,
  'Emulate a card with this much memory, in GB (1e9 bytes), less the same overhead as --gpu. '
  'A card sold as "11 GB" has 11 GiB = 11.81 GB; --gpu knows each catalog card\'s size.',
)
validators.positive(MEMORY_GB, 'GB')
GPUS = flags.DEFINE_list(
  'gpus',
  [],
  'Catalog GPUs to sweep or predict, comma-separated; "lambda2020" names the eight GPUs of '
  'the 2020 benchmark.',
)
PRECISIONS = flags.DEFINE_list(
  'precisions',
  [],
  'Precisions, comma-separated (e.g. fp32,bf16): a sweep\'s, or a benchmark\'s. Default: each '
  'workload\'s precision in the 2020 benchmark (the benchmarks: as their --help says).',
)
flags.register_validator(
  PRECISIONS,
  lambda names: all(n in validators.PRECISION_NAMES for n in names),
  message=f'each must be one of {", ".join(validators.PRECISION_NAMES)}',
)
PREDICT = flags.DEFINE_bool(
  'predict',
  False,
  'Predict the largest batch for each card of --gpus (or --gpu, --memory_gb) from the '
  'compiler\'s memory plan: compile only, run and time nothing.',
)
COMPILE_FOR = flags.DEFINE_string(
  'compile_for',
  None,
  'With --predict: compile for this GPU (h200) on a host that has none, through JAX\'s CUDA '
  'plugin. Nothing is autotuned in such a compile.',
)
CELL_TIMEOUT_S = flags.DEFINE_integer(
  'cell_timeout_s',
  3600,
  'Sweep: seconds after which a cell is killed and recorded as failed (a --predict cell gets '
  'this per GPU).',
  lower_bound=1,
)
RETRY_FAILED = flags.DEFINE_bool(
  'retry_failed', False, 'Sweep: run again the cells recorded as failed (a crash or a timeout).'
)
