"""A benchmark of the GPU's matrix-product rate through JAX: the rate a workload's TFLOP/s is held
against (its model FLOP utilization; docs/performance.md, "bf16 at the max batch").

    python -m jaxbench.matmul_benchmark                    # bf16, 8192 x 8192 x 8192
    python -m jaxbench.matmul_benchmark --precisions=tf32,bf16,fp16
    python -m jaxbench.matmul_benchmark --size=256 --products=4   # a quick check on a CPU

--precisions defaults to bf16. For each precision: --products jitted products of --size square
matrices, rotating through --pairs pairs of random matrices, queued and timed on the host to the
last one's end (jaxbench/core/timing.py, as a run's steps), --repeats times after one untimed
product per pair. A row gives the median rate in TFLOP/s (2 x size^3 a product) with the lowest and
highest round, and the compile. fp32 forbids TF32 (full float32 products), tf32 allows it, bf16 and
fp16 multiply in their own dtype, as the workloads' precision policies do. A benchmark, not a test:
a slow GPU fails nothing.
"""

import functools
import itertools
import statistics
import time

from absl import app, flags

from flags import matmul_benchmark as bench_flags
from flags import sweep as sweep_flags
from jaxbench import cli

flags.adopt_module_key_flags(bench_flags)
flags.declare_key_flag('precisions')

_fail = functools.partial(cli.fail, 'jaxbench.matmul_benchmark')
HEADER = ('device', 'precision', 'size', 'TFLOP/s', 'lowest', 'highest', 'compile s')
DEFAULT_PRECISIONS = ('bf16',)


def lower(policy, a, b):
  """The jitted product a @ b lowered under the precision policy's matmul precision."""
  import jax  # pylint: disable=g-import-not-at-top

  with jax.default_matmul_precision(policy.matmul_precision):
    return jax.jit(lambda x, y: x @ y).lower(a, b)


def rates(precision_name: str, size: int, products: int, pairs: int, repeats: int) -> dict:
  """The rounds' rates in TFLOP/s and the compile's seconds of one precision's product."""
  import jax  # pylint: disable=g-import-not-at-top

  from jaxbench.core import timing  # pylint: disable=g-import-not-at-top
  from models import precision  # pylint: disable=g-import-not-at-top

  policy = precision.get(precision_name)
  keys = jax.random.split(jax.random.key(0), 2 * pairs)
  operands = [jax.random.normal(k, (size, size), policy.compute_dtype) for k in keys]
  start = time.perf_counter()
  compiled = lower(policy, operands[0], operands[1]).compile()
  compile_s = time.perf_counter() - start
  pair = itertools.cycle(range(pairs))

  def product():
    j = next(pair)
    return compiled(operands[2 * j], operands[2 * j + 1])

  # Each pair's first product untimed, then --repeats windows of --products, as a run's steps.
  seconds, _, _ = timing.windows(product, jax.block_until_ready, pairs, products, repeats)
  return {'rates': [2 * size**3 / s / 1e12 for s in seconds], 'compile_s': compile_s}


def _rate(tflops: float) -> str:
  """A rate as the table prints it: 0.1 TFLOP/s resolution, 3 digits below 10."""
  return f'{tflops:.1f}' if tflops >= 10 else f'{tflops:.3g}'


def rows(precisions, size, products, pairs, repeats) -> list[tuple]:
  """A table row per precision."""
  import jax  # pylint: disable=g-import-not-at-top

  device = jax.devices()[0].device_kind
  out = []
  for name in precisions:
    r = rates(name, size, products, pairs, repeats)
    median_low_high = [statistics.median(r['rates']), min(r['rates']), max(r['rates'])]
    out.append((device, name, size, *map(_rate, median_low_high), f'{r["compile_s"]:.2f}'))
  return out


def main(argv: list[str]) -> int:
  del argv  # cli.flags_parser refuses arguments that are not flags
  from jaxbench.core import backend  # pylint: disable=g-import-not-at-top

  precisions = sweep_flags.PRECISIONS.value or list(DEFAULT_PRECISIONS)
  try:
    backend.configure(None, remat=False)  # a run's XLA options: cuBLAS products
  except backend.BackendError as e:
    _fail(str(e))
  table = rows(
    precisions,
    bench_flags.SIZE.value,
    bench_flags.PRODUCTS.value,
    bench_flags.PAIRS.value,
    bench_flags.REPEATS.value,
  )
  cli.print_columns(HEADER, table, left=2)
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser('jaxbench.matmul_benchmark'))
