"""The bytes a training step's kernels read and write, from the program XLA compiles for it.

    python -m jaxbench.step_traffic --models=transformer_big --precision=bf16 --compile_for=h200
    python -m jaxbench.step_traffic --models=transformer_big --precision=bf16 --compile_for=h200 \\
        --set=attention_probs=fused --by=op --depth=4
    python -m jaxbench.step_traffic --models=bert_base --tiny   # a quick check on a CPU

Compiles each workload's step at its comparison batch (jaxbench/pytorch/frameworks.py's table;
--batch_size in the workload's unit, 2 examples with --tiny), with the XLA options a run uses, on
this machine's device or, with --compile_for, for a described GPU from its CPU. Runs nothing.
Prints the bytes of the fusions, the library calls (cuBLAS, cuDNN, Triton) and the other
operations, for a GPU's program the threefry hashes a step computes (its random numbers' and its
dropout masks' arithmetic), then the largest groups of kernels (jaxbench/core/traffic.py says
what is counted).
Two forms of one step compiled this way can be weighed before a GPU times them: XLA_FLAGS and
--set change the program, and the totals say by how many bytes.
"""

import functools

from absl import app, flags

from flags import benchmarks as shared_flags
from flags import run as run_flags
from flags import step_traffic as traffic_flags
from flags import sweep as sweep_flags
from jaxbench import cli

flags.adopt_module_key_flags(traffic_flags)
for _name in ('models', 'precision', 'batch_size', 'set', 'tiny', 'compile_for'):
  flags.declare_key_flag(_name)

_fail = functools.partial(cli.fail, 'jaxbench.step_traffic')
TINY_EXAMPLES = 2


def examples(w, cfg, batch: int | None, tiny: bool) -> int:
  """The examples to compile for: --batch_size in the workload's unit, else the comparison
  batch (TINY_EXAMPLES under the tiny preset)."""
  from jaxbench.core import run_record  # pylint: disable=g-import-not-at-top
  from jaxbench.pytorch import frameworks  # pylint: disable=g-import-not-at-top

  if batch is None and tiny:
    return TINY_EXAMPLES
  n = run_record.examples_for(w, cfg, batch or frameworks.REFERENCE_BATCH[w.name])
  if n < 1:
    raise ValueError(f'{w.name}: --batch_size={batch} is less than one example')
  return n


def size(b: float) -> str:
  """Bytes in GB, MB or kB (1e9, 1e6, 1e3), whichever keeps two decimals meaningful."""
  for unit, scale in (('GB', 1e9), ('MB', 1e6)):
    if b >= 0.1 * scale:
      return f'{b / scale:.2f} {unit}'
  return f'{b / 1e3:.2f} kB'


def report(name, precision_name, batch, overrides, tiny, target, by, depth, top) -> list[str]:
  """One workload's lines: what was compiled, the totals, then the largest groups."""
  import jax  # pylint: disable=g-import-not-at-top

  from jaxbench.core import program, traffic  # pylint: disable=g-import-not-at-top
  from models import precision, registry  # pylint: disable=g-import-not-at-top

  w = registry.get(name)
  cfg = w.resolve(tiny=tiny, overrides=overrides)
  policy = precision.get(precision_name or w.default_precision)
  n = examples(w, cfg, batch, tiny)
  compiled = program.Program(w, cfg, policy, target=target).compile(n)
  ks = traffic.kernels(compiled.executable.as_text())
  sums = traffic.totals(ks)
  total = sum(sums.values())
  batch = f'{n * w.example_size(cfg):,} {w.unit} ({n} examples)'
  lines = [
    f'{name} {policy.name} at {batch}: {len(ks)} kernels, '
    f'{size(total)} read and written a step; '
    + ', '.join(f'{k} {size(v)}' for k, v in sums.items())
    + f'; forecast peak {size(compiled.peak_bytes)}'
  ]
  if target is not None or jax.default_backend() == 'gpu':  # a CPU's hashes are rolled loops
    lines[0] += f'; {traffic.threefry_hashes(ks) / 1e6:,.1f} M threefry hashes'

  rows = [
    (key, str(count), size(b), f'{100 * b / max(total, 1):.1f}%')
    for key, count, b in traffic.group(ks, by, depth)[:top]
  ]
  widths = [max(len(r[i]) for r in rows) for i in range(4)] if rows else [0] * 4
  for key, count, moved, share in rows:
    lines.append(
      f'  {moved.rjust(widths[2])} {share.rjust(widths[3])}  {count.rjust(widths[1])} x  {key}'
    )
  return lines


def main(argv: list[str]) -> int:
  del argv  # cli.flags_parser refuses arguments that are not flags
  from jaxbench.cards import deviceless  # pylint: disable=g-import-not-at-top
  from jaxbench.core import backend  # pylint: disable=g-import-not-at-top
  from models import precision  # pylint: disable=g-import-not-at-top

  names = shared_flags.MODELS.value
  if not names:
    _fail('--models: name at least one workload (--list_models in jaxbench.main lists them)')
  try:
    workloads = cli.resolve_models(names)
    overrides = dict(cli.parse_overrides(run_flags.SET.value))
  except cli.UsageError as e:
    _fail(str(e))
  target = sweep_flags.COMPILE_FOR.value
  tiny = run_flags.TINY.value
  try:
    deviceless.start(target)  # before JAX starts: the host runs on its CPU
  except ValueError as e:
    _fail(str(e))
  try:
    backend.configure(None, remat=False)  # a run's XLA options: cuBLAS products, no remat
  except backend.BackendError as e:
    _fail(str(e))
  if tiny is None:  # as a run: the tiny preset on a host without a GPU, unless compiling for one
    import jax  # pylint: disable=g-import-not-at-top

    tiny = target is None and jax.default_backend() != 'gpu'
  for w in workloads:  # every check before the first compile
    try:
      precision.get(run_flags.PRECISION.value or w.default_precision)
      examples(w, w.resolve(tiny=tiny, overrides=overrides), run_flags.BATCH_SIZE.value, tiny)
    except ValueError as e:
      _fail(str(e))
  device = None
  try:
    if target is not None:
      device = deviceless.device(target)
    for w in workloads:
      lines = report(
        w.name,
        run_flags.PRECISION.value,
        run_flags.BATCH_SIZE.value,
        overrides,
        tiny,
        device,
        traffic_flags.BY.value,
        traffic_flags.DEPTH.value,
        traffic_flags.TOP.value,
      )
      print('\n'.join(lines), flush=True)
  except deviceless.DevicelessError as e:
    _fail(str(e))
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser('jaxbench.step_traffic'))
