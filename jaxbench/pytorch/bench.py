"""One benchmark run of a workload's PyTorch peer: the max-batch search (or a fixed batch) and the
timing of jaxbench/core/bench.run, and a result of the same schema, marked framework 'pytorch'.

The search is jaxbench/core/search.find_max_batch over a pytorch.program.Program: with no memory
forecast it doubles, then bisects, each probe running real steps under the allocator's cap.
"""

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

import jaxbench
from jaxbench.core import backend, interrupt, probe, run_record, search, search_log
from jaxbench.core import bench as core_bench
from jaxbench.core import progress as display
from jaxbench.pytorch import environment
from jaxbench.pytorch import policy as policy_lib
from jaxbench.pytorch import program as program_lib
from models import workload as wl
from models.pytorch import registry

FRAMEWORK = 'pytorch'


def budget(memory: backend.MemorySetup, device: torch.device) -> tuple[int, str]:
  """The bytes a trial may use, and how that is enforced. On a GPU the allocator is capped at the
  budget a JAX run's pool gets (--memory_limit_gb, the emulated card, else
  backend.DEFAULT_MEM_FRACTION of the GPU); on the CPU the estimate of program.py is bounded."""
  if device.type == 'cuda':
    total = torch.cuda.get_device_properties(device).total_memory
    limit = memory.limit_bytes or int(backend.DEFAULT_MEM_FRACTION * total)
    if limit > total:
      raise ValueError(
        f'the memory limit {limit / 1e9:.1f} GB exceeds the GPU\'s {total / 1e9:.1f} GB'
      )
    torch.cuda.set_per_process_memory_fraction(limit / total, device)
    return limit, 'allocator'
  if memory.limit_bytes is not None:
    return memory.limit_bytes, 'estimated tensor bytes'
  gb = run_record.CPU_DEFAULT_BUDGET_GB
  return int(gb * 1e9), f'estimated tensor bytes (CPU default {gb} GB)'


def identity(w, cfg, pol, tiny, dev, torch_compile) -> dict[str, Any]:
  """What every PyTorch result records about its software, device and workload."""
  peer = registry.get(w.name)
  return {
    'schema': run_record.SCHEMA,
    'framework': FRAMEWORK,
    'jaxbench_version': jaxbench.__version__,
    **environment.environment(),
    'device': dev,
    'workload': w.name,
    'workload_revision': w.revision,
    'unit': w.unit,
    'throughput_unit': w.throughput_unit,
    'precision': pol.name,
    'tiny': tiny,
    'config': dict(cfg),
    'torch_compile': torch_compile,
    'peer': {
      'source': peer.source,
      'differences': list(peer.differences),
      # What --torch_compile compiles: None, each update's loss; else these modules.
      'compiled': None if peer.compiled is None else list(peer.compiled),
    },
    'cudnn_benchmark': torch.backends.cudnn.benchmark,
    'allow_tf32': {
      'matmul': torch.backends.cuda.matmul.allow_tf32,
      'cudnn': torch.backends.cudnn.allow_tf32,
    },
  }


def run(
  w: wl.Workload,
  opts: core_bench.Options,
  memory: backend.MemorySetup,
  log=print,
  checkpoint: Callable[[dict[str, Any]], None] | None = None,
  torch_compile: bool = False,
) -> dict[str, Any]:
  """Search the peer's max batch (or take opts.batch_size), time it, and return the result, as
  core.bench.run does for the JAX workload (`checkpoint` too)."""
  pol = policy_lib.get(opts.precision or w.default_precision)
  policy_lib.apply(pol)
  cfg = w.resolve(tiny=opts.tiny, overrides=dict(opts.overrides))
  # With its index: set_per_process_memory_fraction refuses a bare 'cuda'.
  device = torch.device('cuda', 0) if torch.cuda.is_available() else torch.device('cpu')
  dev = environment.device_info(device)
  limit, enforced = budget(memory, device)
  if device.type == 'cuda':
    dev['pool_bytes'] = limit
  result: dict[str, Any] = {
    **identity(w, cfg, pol, opts.tiny, dev, torch_compile),
    'timestamp': run_record.now(),
    'memory': {
      'limit_bytes': memory.limit_bytes,
      'budget_bytes': limit,
      'enforced_by': enforced,
      'remat': False,
    },
  }
  program = program_lib.Program(
    w,
    cfg,
    registry.get(w.name),
    pol,
    device,
    seed=opts.seed,
    torch_compile=torch_compile,
    cpu_budget_bytes=limit,
  )
  progress = run_record.Progress(line=display.Line(w.name, w.unit))
  progress.line.set_phase(progress.phase)
  if checkpoint is not None:
    progress.changed = lambda: checkpoint(
      run_record.so_far(
        w, cfg, opts, result, progress, f'ended without its result, while {progress.phase}'
      )
    )
  try:
    with display.Display(progress.line):
      return _search_and_time(w, opts, cfg, program, result, progress, log)
  except KeyboardInterrupt:
    interrupt.taken()
    raise core_bench.Interrupted(
      run_record.so_far(w, cfg, opts, result, progress, f'interrupted while {progress.phase}')
    ) from None


def _search_and_time(w, opts, cfg, program, result, progress, log) -> dict[str, Any]:
  """The body of run(), reporting its phase and trials to `progress` as it goes."""
  size = w.example_size(cfg)

  def on_trial(t: probe.Trial) -> None:
    progress.add(t)
    progress.running = None
    if program.init_s is not None:
      result['init_s'] = round(program.init_s, 3)
    progress.changed()
    log(search_log.trial_line(w, t))

  def on_phase(n: int, phase: str, trial: probe.Trial | None) -> None:
    progress.running = trial
    if phase == probe.COMPILING:
      return  # nothing is compiled ahead of a PyTorch step
    batch = f'{n * size} {w.unit}'
    fixed = opts.batch_size is not None
    progress.set_phase(
      f'{phase} the fixed batch ({batch})' if fixed else f'searching: {phase} batch {batch}'
    )
    progress.changed()
    log(f'  {w.name}: batch {batch}: {phase}')

  result['params'] = program.param_counts()
  if opts.batch_size is not None:
    result['search'] = {'mode': 'fixed'}
    n = run_record.examples_for(w, cfg, opts.batch_size)
    start = time.perf_counter()
    trial, compiled = probe.probe(program, n, None, on_phase=on_phase)
    on_trial(trial)
    error = trial.detail if trial.outcome == probe.ERROR else None
    found = search.Result(
      n if trial.fits else 0, [trial], time.perf_counter() - start, None, compiled, error
    )
  else:
    result['search'] = {'mode': 'search', 'tolerance': opts.search_tolerance, 'run_every_fit': True}
    found = search.find_max_batch(
      program,
      None,
      opts.max_examples,
      on_trial=on_trial,
      tolerance=opts.search_tolerance,
      on_phase=on_phase,
    )
  result['search'].update(
    trials=[dataclasses.asdict(t) for t in found.trials],
    seconds=round(found.seconds, 2),
    compiles=0,
    cache_loads=0,
    capped=found.capped,
  )
  ended = run_record.search_ended(result, found, size, opts)
  if ended is not None:
    return ended
  progress.set_phase(f'timing at {found.max_examples * size} {w.unit}')
  progress.changed()
  log(f'  {w.name}: {progress.phase}')
  m, first_s = program_lib.measure(
    program, found.max_examples, opts.warmup_steps, opts.steps, opts.windows
  )
  program.release()
  result['measurement'] = {
    **run_record.timed(w, cfg, m),
    'predicted_peak_bytes': None,
    # The timed run's first warm-up step, and (torch.compile) the first trial's first step: the
    # compile from a cold cache, which the timed run reloads from Inductor's caches.
    'first_step_s': None if first_s is None else round(first_s, 3),
    'compile_s': _compile_s(program),
    'compile_cached': False,
    'profile_dir': None,
    'profile': None,
  }
  if not m.finite:
    return {**result, 'status': 'invalid', 'error': f'loss not finite after timing: {m.final_loss}'}
  return {**result, 'status': 'ok', 'error': None}


def _compile_s(program: program_lib.Program) -> float | None:
  """torch.compile's seconds: the first trial's first step (None for an eager run)."""
  if not program.torch_compile or program.first_step_s is None:
    return None
  return round(program.first_step_s, 3)
