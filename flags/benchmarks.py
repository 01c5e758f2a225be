"""The flag the benchmarks beside the main command share (jaxbench.init_benchmark,
jaxbench.attention_benchmark): one definition, since a process may import both."""

from absl import flags

MODELS = flags.DEFINE_list(
  'models',
  [],
  'Workloads to benchmark, comma-separated. Default: the benchmark\'s own (its --help says which).',
)
