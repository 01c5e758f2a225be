"""Flags of the step's traffic (python -m jaxbench.step_traffic); it takes --models from
flags/benchmarks.py, --precision, --batch_size, --set and --tiny from flags/run.py and
--compile_for from flags/sweep.py."""

from absl import flags

BY = flags.DEFINE_enum(
  'by',
  'kind',
  ['kind', 'op'],
  'Group the kernels by their kind (a fusion\'s kind and name, a library call\'s target) or by '
  'the JAX operation they came from (its name\'s first --depth parts, numbered layers folded).',
)
DEPTH = flags.DEFINE_integer(
  'depth', 3, 'With --by=op: how many parts of the op name make a row.', lower_bound=1
)
TOP = flags.DEFINE_integer(
  'top', 20, 'Rows printed per workload, the largest first.', lower_bound=1
)
