"""jaxbench's entry point, intentionally kept short: parse flags, validate, dispatch.

python -m jaxbench.main --model=transformer_big
"""

import faulthandler
import signal
import sys

from absl import flags

from flags import run as run_flags
from flags import search as search_flags
from flags import sweep as sweep_flags  # noqa: F401  (defines --gpu, --gpus, --store, ...)

FLAGS = flags.FLAGS


def _fail(message: str) -> None:
  print(f'jaxbench: error: {message}', file=sys.stderr)
  sys.exit(2)


def dump_stacks_on_sigusr1() -> None:
  """`kill -USR1 PID` prints every thread's Python stack to stderr, and the run goes on.

  For a run that does not react to SIGINT (scripts/gpu_queue.py sends SIGUSR1 before its
  SIGINT and again before its SIGKILL): the stacks show where the main thread waits and what
  the XLA worker thread (program._interruptible) is in. faulthandler writes them from its C
  signal handler without taking the GIL, so they come even while XLA holds it. Costs nothing
  until the signal comes. Not on platforms without SIGUSR1 (Windows).
  """
  if hasattr(signal, 'SIGUSR1'):
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def main(argv: list[str]) -> int:
  try:
    extra = FLAGS(argv)[1:]
  except flags.Error as e:
    _fail(str(e).splitlines()[0])
  if extra:
    _fail(f'unexpected arguments: {" ".join(extra)}')
  from jaxbench.cards import emulation  # pylint: disable=g-import-not-at-top

  try:
    req = emulation.request(FLAGS)
  except ValueError as e:
    _fail(str(e))
  if req.kind == emulation.SWEEP:  # each cell in a fresh process: this one starts no JAX
    from jaxbench.cards import sweep  # pylint: disable=g-import-not-at-top

    return sweep.main(FLAGS, list(req.gpus), _fail)
  from jaxbench.cards import deviceless  # pylint: disable=g-import-not-at-top
  from jaxbench.core import backend

  if req.target is not None:
    deviceless.prepare()  # the host compiles on its CPU; the GPU is only described

  # XLA reads its memory and compiler options once, when the backend starts,
  # and importing a model may start it: configure first, import the rest after.
  limit = req.limit_gb if req.gpus else search_flags.MEMORY_LIMIT_GB.value
  if limit is not None and limit <= 0:
    _fail(f'--memory_limit_gb must be positive, got {limit}')
  try:
    memory = backend.configure(
      limit,
      search_flags.REMAT.value,
      search_flags.COMPILATION_CACHE_DIR.value,
      search_flags.TRITON_GEMM.value,
      search_flags.AUTOTUNE_LEVEL.value,
      search_flags.AUTOTUNE_CACHE_DIR.value,
      search_flags.AUTOTUNE_LOG.value,
    )
  except backend.BackendError as e:
    _fail(str(e))
  from jaxbench import cli, describe
  from jaxbench.core import (
    bench,
    runner,  # pylint: disable=g-import-not-at-top
  )

  try:
    plan = cli.plan(FLAGS)
  except cli.UsageError as e:
    _fail(str(e))
  if plan.action == 'list':
    print('\n'.join(describe.list_line(w) for w in plan.workloads))
    return 0
  if plan.action == 'describe':
    for w in plan.workloads:
      print(describe.describe(w, plan.options.tiny, dict(plan.options.overrides)))
    return 0
  target, tiny = None, run_flags.TINY.value
  if req.target is not None:
    try:
      target = deviceless.device(req.target)
    except deviceless.DevicelessError as e:
      _fail(str(e))
    tiny = bool(tiny)  # the described GPU gets full size unless --tiny says otherwise
  if plan.action == 'check':
    print(f'jaxbench: ok: the flags are valid for {", ".join(w.name for w in plan.workloads)}')
    return 0
  return runner.run(plan, bench.resolve_tiny(plan.options, tiny), req, memory, target)


if __name__ == '__main__':
  dump_stacks_on_sigusr1()  # first: before JAX starts and long before any deadline
  try:
    sys.exit(main(sys.argv))
  except KeyboardInterrupt:
    print('jaxbench: interrupted', file=sys.stderr)
    from jaxbench.core import program  # pylint: disable=g-import-not-at-top

    program.exit_now(130)  # a compile may still be running in its thread
