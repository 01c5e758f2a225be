"""--store: a sweep's JSON Lines file, which the sweep appends to and the report reads."""

from absl import flags

STORE = flags.DEFINE_string(
  'store',
  None,
  'Sweep: append each cell\'s result to this JSON Lines file, running each cell in its own '
  'process and skipping those it holds. The report reads one or more such files, comma-separated.',
)
