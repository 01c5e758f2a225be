"""jaxbench: the largest batch each workload trains at on a GPU, and its throughput.

Usage: python -m jaxbench.main --model=NAME[,NAME...] [flags]
       python -m jaxbench.main --list_models

--helpshort lists the flags below; --helpfull adds those of the search's and the compiler's
inner workings (flags/advanced.py) and absl's own.
"""

import dataclasses
import functools
import os
import sys

from jaxbench.core import interrupt

if __name__ == '__main__':  # before the imports below, which take a second on a slow machine
  interrupt.exit_while_loading('jaxbench')

from absl import app, flags

from flags import advanced as advanced_flags  # noqa: F401  (defines the advanced flags)
from flags import parallel as parallel_flags
from flags import pytorch as pytorch_flags
from flags import run as run_flags
from flags import search as search_flags
from flags import store as store_flags
from flags import sweep as sweep_flags
from flags import train as train_flags
from jaxbench import cli
from jaxbench.results import store

# Intentionally kept short: the flags are read once, into cli.Args, and the work dispatched.
FLAGS = flags.FLAGS
for _module in (
  run_flags,
  search_flags,
  sweep_flags,
  store_flags,
  train_flags,
  pytorch_flags,
  parallel_flags,
):
  flags.adopt_module_key_flags(_module)  # what --helpshort lists


fail = functools.partial(cli.fail, 'jaxbench')


def read_args() -> cli.Args:
  """The parsed flags as plain values, the only read of FLAGS."""
  values = {f.name: FLAGS[f.name].value for f in dataclasses.fields(cli.Args)}
  return cli.Args(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def main(argv: list[str]) -> int:
  del argv  # cli.flags_parser refuses arguments that are not flags
  from jaxbench.cards import deviceless, emulation  # pylint: disable=g-import-not-at-top

  args = read_args()
  from jaxbench.train import options as train_options  # pylint: disable=g-import-not-at-top

  try:
    train_options.check_flags(args)  # before the cards: training is one run on the device
    req = emulation.request(args)
  except (ValueError, cli.UsageError) as e:
    fail(str(e))
  if req.kind == emulation.SWEEP:  # each cell in a fresh process: this one starts no JAX
    from jaxbench.cards import sweep  # pylint: disable=g-import-not-at-top

    return sweep.main(args, list(req.gpus), fail)
  if args.frameworks:  # each framework in a fresh process: this one starts neither
    from jaxbench.pytorch import frameworks  # pylint: disable=g-import-not-at-top

    return frameworks.main(args, fail)
  from jaxbench.core import backend, mesh  # pylint: disable=g-import-not-at-top
  from jaxbench.pytorch import usage  # pylint: disable=g-import-not-at-top

  torch_run = args.framework == 'pytorch'

  if req.target is not None:
    deviceless.prepare()  # the host compiles on its CPU; the GPU is only described
  # XLA reads its memory and compiler options once, when the backend starts,
  # and importing a model may start it: configure first, import the rest after.
  try:  # a PyTorch run: its allocator gets the memory, and JAX the CPU
    memory = (
      usage.prepare(req.limit_gb if req.gpus else args.memory_limit_gb) if torch_run else None
    )
    memory = memory or backend.configure(
      req.limit_gb if req.gpus else args.memory_limit_gb,
      args.remat,
      args.compilation_cache_dir,
      args.triton_gemm,
      args.autotune_level,
      args.autotune_cache_dir,
      args.autotune_log,
    )
    hosts = mesh.Hosts(args.coordinator_address, args.num_processes, args.process_id)
    mesh.start(args.devices, hosts)  # which GPUs JAX sees, and the other hosts: before it starts
  except (backend.BackendError, mesh.MeshError) as e:
    fail(str(e))
  from jaxbench import describe  # pylint: disable=g-import-not-at-top
  from jaxbench.core import run_record, runner  # pylint: disable=g-import-not-at-top

  if args.tiny is None and not (args.describe or args.list_models):
    # The preset a run gets decides what its --set values must satisfy: fix it before the plan.
    on_gpu = usage.on_gpu() if torch_run else run_record.on_gpu()
    args = dataclasses.replace(args, tiny=req.target is None and not on_gpu)
  try:
    plan = cli.plan(args)
  except cli.UsageError as e:
    fail(str(e))
  if plan.action == 'list':
    print('\n'.join(describe.list_line(w) for w in plan.workloads))
    return 0
  if plan.action == 'describe':
    for w in plan.workloads:
      print(describe.describe(w, plan.options.tiny, dict(plan.options.overrides)))
    return 0
  target = None
  if req.target is not None:  # the described GPU gets full size unless --tiny says otherwise
    try:
      target = deviceless.device(req.target)
    except deviceless.DevicelessError as e:
      fail(str(e))
  if plan.action == 'check':
    for line in plan.warnings:
      print(f'jaxbench: {line}', file=sys.stderr)
    print(f'jaxbench: ok: the flags are valid for {", ".join(w.name for w in plan.workloads)}')
    return 0
  try:
    with store.Lock(plan.output, shared=True):  # not beside a sweep on the same store
      return runner.run(plan, plan.options, req, memory, target)
  except store.Busy as e:
    fail(f'--output: {e}')


if __name__ == '__main__':
  interrupt.install()  # a Ctrl-C during JAX's import or a compile is not dropped
  try:
    app.run(main, flags_parser=cli.flags_parser('jaxbench'))
  except KeyboardInterrupt:
    print('jaxbench: interrupted', file=sys.stderr)
    interrupt.exit_now(130)  # a compile may still be running in its thread
  except BrokenPipeError:  # the reader of stdout has gone (e.g. `| head`): nothing left to say
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(1)
