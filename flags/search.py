"""Flags of the memory a run may use."""

from absl import flags

from flags import validators

MEMORY_LIMIT_GB = flags.DEFINE_float(
  'memory_limit_gb',
  None,
  'Search the largest batch that fits in this much memory, in GB (1e9 bytes). On a GPU it '
  'caps JAX\'s allocator; on the CPU it bounds the peak the compiler predicts.',
)
validators.positive(MEMORY_LIMIT_GB, 'GB')
