"""Flags of the initial state's compile benchmark (python -m jaxbench.init_benchmark); it takes
--models from flags/benchmarks.py, --precision and --tiny from flags/run.py and --compile_for from
flags/sweep.py."""

from absl import flags

# --models' default: the workloads whose init compiled longest before its draws were pooled.
DEFAULT_MODELS = (
  'nasnet_large',
  'mask_rcnn',
  'mt_dnn',
  'deeplabv3',
  'transformer_big',
  'bert_base',
)
ROUNDS = flags.DEFINE_integer(
  'rounds',
  2,
  'Compile each form this many times, in turn (per array, pooled, per array, pooled, ...).',
  lower_bound=1,
)
