"""Flags of the matrix-product rate benchmark (python -m jaxbench.matmul_benchmark); it takes
--precisions from flags/sweep.py."""

from absl import flags

SIZE = flags.DEFINE_integer(
  'size', 8192, 'The products are SIZE x SIZE by SIZE x SIZE.', lower_bound=1
)
PRODUCTS = flags.DEFINE_integer(
  'products', 50, 'Products queued in one timed round, each waited for at its end.', lower_bound=1
)
PAIRS = flags.DEFINE_integer(
  'pairs',
  8,
  'Distinct pairs of random matrices the products rotate through, so that no product reads its '
  'operands from the cache the one before left.',
  lower_bound=1,
)
REPEATS = flags.DEFINE_integer(
  'repeats',
  5,
  'Timed rounds of --products; the rate reported is their median, with the lowest and highest.',
  lower_bound=1,
)
