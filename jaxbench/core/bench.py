"""One benchmark run of one workload: search (or a fixed batch), then timing; a result dict."""

import dataclasses
from collections.abc import Callable
from typing import Any

from jaxbench import cli
from jaxbench.core import (
  backend,
  find,
  init_cache,
  interrupt,
  kernel_time,
  mesh,
  run_record,
  scaling,
  timing,
)
from jaxbench.core import program as prog
from jaxbench.core import progress as display
from models import precision
from models import workload as wl


@dataclasses.dataclass(frozen=True)
class Options:
  precision: str | None = None  # None: the workload's 2020 default
  tiny: bool = False
  overrides: tuple[tuple[str, str], ...] = ()
  batch_size: int | None = None  # in the workload's unit; None: search
  warmup_steps: int = 3
  steps: int = 20
  windows: int = 5
  seed: int = 0
  max_examples: int = 1 << 20
  verify_predicted_oom: bool = False
  search_tolerance: float = cli.SEARCH_TOLERANCE  # within this fraction of the max (0: exact)
  search_hints: tuple[str, ...] = ()  # result files whose trials aim the search (hints.py)
  # Start from the decided trials in search_hints of earlier runs of this program under this
  # memory (hints.decided), rather than only aim at them.
  search_resume: bool = False
  # Run each probe predicted to fit (the default), or only the largest fit, before its timing.
  run_every_fit: bool = True
  # Probe compile-only with XLA's autotuning at this level, then compile and run only the batch
  # found with the run's own autotuning (probing.find_max_batch_probing); None: probe as run.
  probe_autotune_level: int | None = None
  # Write a jax.profiler trace of one window of the timed steps here (timing.measure).
  profile_dir: str | None = None
  # Data parallelism (mesh.py): this process's devices in the mesh; the optimizer state split
  # over them (ZeRO-1); one device timed too at the same per-device batch, for the scaling.
  devices: int = 1
  shard_optimizer: bool = False
  scaling: bool = False


class Interrupted(KeyboardInterrupt):
  """A run stopped by SIGINT (Ctrl-C, a job's deadline), carrying what it had found.

  The result has status 'interrupted': the search trials so far, and the max batch as the
  largest batch that ran (a lower bound while the search was still going).
  """

  def __init__(self, result: dict[str, Any]):
    super().__init__(f"{result['workload']} interrupted")
    self.result = result


def run(
  w: wl.Workload,
  opts: Options,
  memory: backend.MemorySetup,
  log=print,
  checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
  """Search the max batch (or take opts.batch_size), time it, and return the result.

  `checkpoint(record)`, if given, gets the result so far (status 'interrupted', the trials up
  to now) after each trial and at each change of phase: what a process killed before it could
  write its result had found (runner's --progress_file).
  """
  policy = precision.get(opts.precision or w.default_precision)
  cfg = w.resolve(tiny=opts.tiny, overrides=dict(opts.overrides))
  dev = run_record.device_info()
  on_gpu = dev['platform'] == 'gpu'
  budget, enforced = run_record.memory_budget(memory, on_gpu)
  result: dict[str, Any] = {
    **run_record.identity(w, cfg, policy, opts.tiny, dev),
    'timestamp': run_record.now(),
    'memory': {
      'limit_bytes': memory.limit_bytes,
      'budget_bytes': budget,
      'enforced_by': enforced,
      'remat': memory.remat,
    },
  }
  progress = run_record.Progress(line=display.Line(w.name, w.unit))
  progress.line.set_phase(progress.phase)
  if checkpoint is not None:
    progress.changed = lambda: checkpoint(
      run_record.so_far(
        w, cfg, opts, result, progress, f'ended without its result, while {progress.phase}'
      )
    )
  try:
    with display.Display(progress.line):  # a live line on a terminal only
      return _search_and_time(w, opts, cfg, policy, budget, result, progress, log)
  except KeyboardInterrupt:
    interrupt.taken()
    raise Interrupted(
      run_record.so_far(w, cfg, opts, result, progress, f'interrupted while {progress.phase}')
    ) from None


def _search_and_time(w, opts, cfg, policy, budget, result, progress, log) -> dict[str, Any]:
  """The body of run(), reporting its phase and trials to `progress` as it goes."""
  layout = mesh.Layout.local(opts.devices, opts.shard_optimizer)
  program = prog.Program(
    w, cfg, policy, seed=opts.seed, layout=layout, init_cache_dir=init_cache.default_dir()
  )
  result['params'] = program.param_counts()
  result['parallel'] = layout.topology()
  progress.set_phase('searching' if opts.batch_size is None else 'compiling the fixed batch')
  found = find.batch(w, cfg, opts, program, budget, result, progress, log)
  result['search'].update(run_record.searched(found))
  ended = run_record.search_ended(result, found, w.example_size(cfg), opts)
  if ended is not None:
    return ended
  progress.set_phase(f'timing at {found.max_examples * w.example_size(cfg)} {w.unit}')
  progress.changed()
  log(f'  {w.name}: {progress.phase}')
  m = timing.measure(
    program, found.best, opts.warmup_steps, opts.steps, opts.windows, opts.profile_dir
  )
  if m.profile is not None:
    for line in kernel_time.lines(w.name, m.profile):
      log(line)
  result['parallel']['global_batch'] = m.examples * program.devices * w.example_size(cfg)
  result['measurement'] = run_record.measurement(w, cfg, m, found.best, program.devices)
  if not m.finite:
    return {**result, 'status': 'invalid', 'error': f'loss not finite after timing: {m.final_loss}'}
  if opts.scaling and program.devices > 1:
    progress.set_phase(f'timing one device at {result["max_batch"]} {w.unit}')
    log(f'  {w.name}: {progress.phase}, for the scaling')
    result['parallel']['scaling'] = scaling.measure(
      w, cfg, policy, opts, found.max_examples, result['measurement']['units_per_s'], layout.size
    )
  return {**result, 'status': 'ok', 'error': None}
