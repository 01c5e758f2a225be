"""A benchmark of the initial state's compile: each workload's init program with its draws made
array by array and pooled (jaxbench/core/pooled_draws.py), compiled in turn in one process.

    python -m jaxbench.init_benchmark --models=nasnet_large,mt_dnn
    python -m jaxbench.init_benchmark --compile_for=h200   # for the H200, on a host without one
    python -m jaxbench.init_benchmark --models=bert_base --tiny   # a quick check on a CPU

--models defaults to nasnet_large, mask_rcnn, mt_dnn, deeplabv3, transformer_big and bert_base,
whose init compiled longest before its draws were pooled. On this machine's device, or with
--compile_for for a described GPU from its CPU (JAX's CUDA plugin; the program a GPU would build).
For each workload and form: the seconds to trace and lower the init and to compile it, its fusions,
its threefry kernels and its temporaries; then the ratio of the forms' median compile times, which
one process measures better than a shared machine's absolute times. A benchmark, not a test: a slow
compile fails nothing.
"""

import functools
import statistics
import time

from absl import app, flags

from flags import benchmarks as shared_flags
from flags import init_benchmark as bench_flags
from flags import run as run_flags
from flags import sweep as sweep_flags
from jaxbench import cli

flags.adopt_module_key_flags(bench_flags)
for _name in ('models', 'precision', 'tiny', 'compile_for'):
  flags.declare_key_flag(_name)

_fail = functools.partial(cli.fail, 'jaxbench.init_benchmark')
HEADER = ('workload', 'form', 'trace+lower s', 'compile s', 'fusions', 'threefry', 'temp GB')


def measure(init, rng, form: str) -> dict:
  """One compile of `init`'s program: its times, fusions, threefry kernels and temporaries."""
  import jax  # pylint: disable=g-import-not-at-top

  from jaxbench.core import program  # pylint: disable=g-import-not-at-top

  jax.clear_caches()  # each compile from scratch
  with program.threefry_as_kernels():
    start = time.perf_counter()
    lowered = jax.jit(init).trace(rng).lower()
    lower_s = time.perf_counter() - start
  start = time.perf_counter()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  text = compiled.as_text()
  memory = compiled.memory_analysis()
  return {
    'form': form,
    'lower_s': lower_s,
    'compile_s': compile_s,
    'fusions': text.count(' fusion('),
    # On a GPU each threefry draw is a kernel of its own (a custom call); a CPU inlines it.
    'threefry': sum('custom-call(' in line and 'threefry' in line for line in text.splitlines()),
    'temp_bytes': None if memory is None else int(memory.temp_size_in_bytes),
  }


def rows(names, precision_name, tiny, target, rounds) -> list[tuple]:
  """Each workload's compiles, both forms in turn `rounds` times, as table rows."""
  import jax  # pylint: disable=g-import-not-at-top

  from jaxbench.cards import deviceless  # pylint: disable=g-import-not-at-top
  from jaxbench.core import pooled_draws  # pylint: disable=g-import-not-at-top
  from models import precision, registry  # pylint: disable=g-import-not-at-top

  rng = jax.random.key(0)
  if target is not None:
    rng = deviceless.abstract(jax.eval_shape(lambda: rng), deviceless.device(target))
  out = []
  for name in names:
    w = registry.get(name)
    policy = precision.get(precision_name or w.default_precision)
    trainer = w.trainer(w.resolve(tiny=tiny), policy)
    forms = {'per array': trainer.init, 'pooled': pooled_draws.pooled(trainer.init)}
    runs = [measure(forms[f], rng, f) for _ in range(rounds) for f in forms]
    for r in runs:
      temp = '' if r['temp_bytes'] is None else f'{r["temp_bytes"] / 1e9:.3f}'
      out.append(
        (name, r['form'], f'{r["lower_s"]:.1f}', f'{r["compile_s"]:.1f}', r['fusions'])
        + (r['threefry'], temp)
      )
    median = {f: statistics.median(r['compile_s'] for r in runs if r['form'] == f) for f in forms}
    out.append((name, 'per array / pooled', '', f'{median["per array"] / median["pooled"]:.2f}x'))
  return out


def main(argv: list[str]) -> int:
  del argv  # cli.flags_parser refuses arguments that are not flags
  from jaxbench.cards import deviceless  # pylint: disable=g-import-not-at-top
  from models import registry  # pylint: disable=g-import-not-at-top

  names = shared_flags.MODELS.value or list(bench_flags.DEFAULT_MODELS)
  unknown = [n for n in names if n not in registry.names()]
  if not names or unknown:
    _fail(f'--models: unknown {", ".join(unknown)}; valid models: {", ".join(registry.names())}')
  target = sweep_flags.COMPILE_FOR.value
  try:
    deviceless.start(target)  # before JAX starts: the host runs on its CPU
  except ValueError as e:
    _fail(str(e))
  if target is not None:
    from models.layers import rbg_init  # pylint: disable=g-import-not-at-top

    rbg_init.BUILD_PLATFORM = 'gpu'
  tiny = run_flags.TINY.value
  if tiny is None:  # as a run: the tiny preset on a host without a GPU, unless compiling for one
    import jax  # pylint: disable=g-import-not-at-top

    tiny = target is None and jax.default_backend() != 'gpu'
  try:
    table = rows(names, run_flags.PRECISION.value, tiny, target, bench_flags.ROUNDS.value)
  except deviceless.DevicelessError as e:
    _fail(str(e))
  cli.print_columns(HEADER, table, left=2)
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser('jaxbench.init_benchmark'))
