"""Flags of the framework a run measures: JAX, its PyTorch peer, or both side by side."""

from absl import flags

FRAMEWORK_NAMES = ('jax', 'pytorch')

FRAMEWORK = flags.DEFINE_enum(
  'framework',
  'jax',
  FRAMEWORK_NAMES,
  'Measure the JAX workload, or its PyTorch peer (models/pytorch) under the same search, '
  'precision, timing and memory budget; pytorch needs pip install -e \'.[pytorch]\'.',
)
FRAMEWORKS = flags.DEFINE_list(
  'frameworks',
  [],
  'Measure each of these frameworks (e.g. jax,pytorch), each in a fresh process with the same '
  'flags, and print them side by side with the ratios of max batch and throughput (JAX over '
  'PyTorch).',
)
flags.register_validator(
  FRAMEWORKS,
  lambda v: all(f in FRAMEWORK_NAMES for f in v) and len(set(v)) == len(v),
  message=f'must list distinct names among {", ".join(FRAMEWORK_NAMES)}',
)
TORCH_COMPILE = flags.DEFINE_bool(
  'torch_compile',
  False,
  'Run the PyTorch side under torch.compile (each update\'s loss compiled); its first step, the '
  'compile, is timed on its own. With --frameworks the PyTorch side runs both eager and compiled, '
  'and the ratios are JAX over the better of the two.',
)
REFERENCE_BATCH = flags.DEFINE_bool(
  'reference_batch',
  False,
  'With --frameworks: run each workload at its fixed comparison batch (the table in '
  'jaxbench/pytorch/frameworks.py, in the workload\'s units) instead of searching or one '
  '--batch_size, so that JAX and PyTorch are compared at the same batch.',
)
