"""One benchmark run of one workload: search (or a fixed batch), then timing; a result dict."""

import dataclasses
import datetime
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import jax

import jaxbench
from jaxbench import cli
from jaxbench.core import backend, environment, hints, mesh, search, timing
from jaxbench.core import program as prog
from jaxbench.core import progress as display
from jaxbench.results import records as report
from models import precision
from models import workload as wl

SCHEMA = 'jaxbench.result/1'
# Without a GPU the search has no device memory to fill; it uses this budget of
# compile-time predicted peak instead, so the command still ends in minutes.
CPU_DEFAULT_BUDGET_GB = 0.25


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
  # found with the run's own autotuning (search.find_max_batch_probing); None: probe as run.
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


def device_info() -> dict[str, Any]:
  dev = jax.local_devices()[0]
  stats = prog.device_memory() or {}
  return {
    'platform': dev.platform,
    'kind': dev.device_kind,
    'count': jax.device_count(),
    'pool_bytes': stats.get('bytes_limit'),
  }


def examples_for(w: wl.Workload, cfg: wl.Config, batch: int) -> int:
  return batch // w.example_size(cfg)


def memory_budget(memory: backend.MemorySetup, on_gpu: bool) -> tuple[int | None, str]:
  """The bytes a program may use, and how that budget is enforced."""
  stats = prog.device_memory()
  if on_gpu and stats and 'bytes_limit' in stats:
    # The allocator's pool is already capped to the limit (backend.configure).
    return stats['bytes_limit'] - stats.get('bytes_in_use', 0), 'allocator'
  if memory.limit_bytes is not None:
    return memory.limit_bytes, 'compile-time analysis'
  if on_gpu:
    return None, 'runtime only'
  return int(
    CPU_DEFAULT_BUDGET_GB * 1e9
  ), f'compile-time analysis (CPU default {CPU_DEFAULT_BUDGET_GB} GB)'


def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')


def identity(
  w: wl.Workload, cfg: wl.Config, policy: precision.Policy, tiny: bool, dev: dict[str, Any]
) -> dict[str, Any]:
  """What every result records about its software, device and workload (the schema's head)."""
  return {
    'schema': SCHEMA,
    'framework': 'jax',
    'jaxbench_version': jaxbench.__version__,
    'jax_version': jax.__version__,
    'python': sys.version.split()[0],
    **environment.environment(),
    'device': dev,
    'xla_flags': os.environ.get('XLA_FLAGS', ''),
    'workload': w.name,
    'workload_revision': w.revision,
    'unit': w.unit,
    'throughput_unit': w.throughput_unit,
    'precision': policy.name,
    'tiny': tiny,
    'config': dict(cfg),
  }


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
  dev = device_info()
  on_gpu = dev['platform'] == 'gpu'
  budget, enforced = memory_budget(memory, on_gpu)
  result: dict[str, Any] = {
    **identity(w, cfg, policy, opts.tiny, dev),
    'timestamp': now(),
    'memory': {
      'limit_bytes': memory.limit_bytes,
      'budget_bytes': budget,
      'enforced_by': enforced,
      'remat': memory.remat,
    },
  }
  progress = _Progress(line=display.Line(w.name, w.unit))
  progress.line.set_phase(progress.phase)
  if checkpoint is not None:
    progress.changed = lambda: checkpoint(
      _so_far(w, cfg, opts, result, progress, f'ended without its result, while {progress.phase}')
    )
  try:
    with display.Display(progress.line):  # a live line on a terminal only
      return _search_and_time(w, opts, cfg, policy, budget, result, progress, log)
  except KeyboardInterrupt:
    raise Interrupted(
      _so_far(w, cfg, opts, result, progress, f'interrupted while {progress.phase}')
    ) from None


@dataclasses.dataclass
class _Progress:
  """How far a run got, for the result of an interrupted one."""

  phase: str = 'building the model'
  trials: list[search.Trial] = dataclasses.field(default_factory=list)
  running: search.Trial | None = None  # the probe being run: compiled, its forecast known
  changed: Callable[[], None] = lambda: None  # after each trial and change of phase
  line: display.Line | None = None  # what the live line shows (progress.py)

  def set_phase(self, phase: str, shown: str | None = None) -> None:
    """The phase an interrupted result names, and the live line's (`shown`, if other)."""
    self.phase = phase
    if self.line is not None:
      self.line.set_phase(shown or phase)

  def add(self, t: search.Trial) -> None:
    self.trials.append(t)
    if self.line is not None and t.outcome != search.UNFINISHED:
      self.line.trial(t.batch, t.fits)


def _so_far(w, cfg, opts, result, progress, error: str) -> dict[str, Any]:
  """The result of a run stopped now: status 'interrupted', its trials so far, the largest
  batch that ran as its max. `result` itself is left as it is."""
  ran = [t for t in progress.trials if t.fits and t.run_s is not None and not t.earlier]
  largest = max((t.examples for t in ran), default=0)
  found = dict(result.get('search') or {'mode': 'search' if opts.batch_size is None else 'fixed'})
  trials = progress.trials + ([progress.running] if progress.running else [])
  found.setdefault('trials', [dataclasses.asdict(t) for t in trials])
  found.setdefault('seconds', None)  # not measured: the search did not end
  record = {**result, 'search': found}
  record.setdefault('max_examples', largest)
  record.setdefault('max_batch', largest * w.example_size(cfg))
  return {**record, 'status': 'interrupted', 'error': error}


def _search_and_time(w, opts, cfg, policy, budget, result, progress, log) -> dict[str, Any]:
  """The body of run(), reporting its phase and trials to `progress` as it goes."""

  def on_trial(t: search.Trial) -> None:
    progress.add(t)
    progress.running = None
    if program.init_s is not None:  # the first trial that ran built the initial state
      result['init_s'] = round(program.init_s, 3)
    progress.changed()  # before the line: a log that shows a trial has it in the checkpoint
    log(trial_line(w, t))

  def on_phase(n: int, phase: str, trial: search.Trial | None) -> None:
    # Where the run is, in the log (runner's log flushes: a log cut by a deadline's SIGKILL
    # still shows the phase) and in an interrupted result's error and trials (a probe cut in
    # its run keeps its compile time and forecast there, as outcome 'unfinished').
    progress.running = trial
    compile_s = None if trial is None else trial.compile_s
    batch = f'{n * w.example_size(cfg)} {w.unit}'
    shown = f'{phase} batch {batch}'
    if trial is not None and program.init_s is None:
      shown = f'building the initial state, then {shown}'  # the first run builds it
    if opts.batch_size is None:
      progress.set_phase(f'searching: {phase} batch {batch}', shown)
    else:
      progress.set_phase(f'{phase} the fixed batch ({batch})', shown)
    what = phase if compile_s is None else f'compiled in {compile_s:.1f} s, {phase}'
    progress.changed()
    log(f'  {w.name}: batch {batch}: {what}')

  layout = mesh.Layout.local(opts.devices, opts.shard_optimizer)
  program = prog.Program(w, cfg, policy, seed=opts.seed, layout=layout)
  result['params'] = program.param_counts()
  result['parallel'] = layout.topology()
  progress.set_phase('searching' if opts.batch_size is None else 'compiling the fixed batch')
  if opts.batch_size is not None:
    result['search'] = {'mode': 'fixed'}
    n = examples_for(w, cfg, opts.batch_size) // program.devices  # --batch_size is global
    start = time.perf_counter()
    trial, compiled = search.probe(
      program, n, budget, verify_predicted_oom=opts.verify_predicted_oom, on_phase=on_phase
    )
    on_trial(trial)
    found = search.Result(
      n if trial.fits else 0,
      [trial],
      time.perf_counter() - start,
      budget,
      compiled,
      trial.detail if trial.outcome == search.ERROR else None,
    )
  else:
    peaks, matched = hints.load(opts.search_hints, result)
    result['search'] = {
      'mode': 'search',
      'tolerance': opts.search_tolerance,
      'hints': {'files': list(opts.search_hints), 'results': matched, 'points': len(peaks)},
      'run_every_fit': opts.run_every_fit,
    }
    known = hints.decided(opts.search_hints, result, budget) if opts.search_resume else []
    ran = len(known)
    if opts.search_resume and budget is not None and not opts.verify_predicted_oom:
      # A forecast is the program's, whatever memory its compile had: every earlier one (a
      # --predict's too) says what compiling its batch again would find under this budget.
      # Fits by forecast count only where this search decides fits so (--norun_every_fit).
      by_forecast = hints.forecast_trials(
        hints.forecasts(opts.search_hints, result), budget, w.example_size(cfg), opts.max_examples
      )
      if opts.run_every_fit:
        by_forecast = [t for t in by_forecast if not t.fits]
      known = hints.combined(known, by_forecast)
    if opts.search_resume:
      result['search']['resumed'] = {
        'trials': len(known),
        'by_forecast': len(known) - ran,
        'runs': sorted({t.earlier for t in known}),
      }
      for t in known:
        progress.add(t)
      if known:
        log(f'  {w.name}: resumed from {len(known)} earlier trials: ' + _trials_text(w, known))
    if opts.probe_autotune_level is not None and budget is None:
      log(f'  {w.name}: no memory budget known, so no compile-only probes: searched autotuned')
    if opts.probe_autotune_level is not None and budget is not None:
      level = opts.probe_autotune_level
      found, check = search.find_max_batch_probing(
        program,
        program.autotuned_at(level),
        level,
        budget,
        opts.max_examples,
        on_trial=on_trial,
        tolerance=opts.search_tolerance,
        hints=peaks,
        on_phase=on_phase,
        run_every_fit=opts.run_every_fit,
      )
      result['search']['probe'] = {
        'autotune_level': level,
        'check': None if check is None else dataclasses.asdict(check),
      }
      if check is not None:
        n = check.examples * w.example_size(cfg)
        log(f'  {w.name}: autotuned at {n} {w.unit}: {probe_check_text(check)}')
    else:
      found = search.find_max_batch(
        program,
        budget,
        opts.max_examples,
        opts.verify_predicted_oom,
        on_trial=on_trial,
        tolerance=opts.search_tolerance,
        hints=peaks,
        on_phase=on_phase,
        known=known,
        run_every_fit=opts.run_every_fit,
      )
  result['search'].update(
    trials=[dataclasses.asdict(t) for t in found.trials],
    seconds=round(found.seconds, 2),
    # This run's compiles; steps loaded from the compilation cache are counted apart.
    compiles=sum(t.compile_s is not None and not t.earlier and not t.cached for t in found.trials),
    cache_loads=sum(t.cached and not t.earlier for t in found.trials),
    capped=found.capped,
  )
  ended = search_ended(result, found, w.example_size(cfg), opts)
  if ended is not None:
    return ended
  progress.set_phase(f'timing at {found.max_examples * w.example_size(cfg)} {w.unit}')
  progress.changed()
  log(f'  {w.name}: {progress.phase}')
  m = timing.measure(
    program, found.best, opts.warmup_steps, opts.steps, opts.windows, opts.profile_dir
  )
  flops_per_step = w.flops_per_example(cfg) * m.examples * program.devices
  units_per_step = w.units_per_example(cfg) * m.examples * program.devices
  result['parallel']['global_batch'] = m.examples * program.devices * w.example_size(cfg)
  result['measurement'] = {
    'batch': m.examples * w.example_size(cfg),
    'examples': m.examples,
    'warmup_steps': m.warmup_steps,
    'steps_per_window': m.steps_per_window,
    'window_step_s': [round(t, 6) for t in m.window_step_s],
    'median_step_s': m.median_step_s,
    'spread_pct': round(m.spread_pct, 2),
    'steps_per_s': 1.0 / m.median_step_s,
    'units_per_s': units_per_step / m.median_step_s,
    'flops_per_step': flops_per_step,
    'tflops_per_s': flops_per_step / m.median_step_s / 1e12,
    'final_loss': m.final_loss,
    'predicted_peak_bytes': found.best.peak_bytes,
    'process_peak_bytes': m.process_peak_bytes,
    'compile_s': found.best.compile_s,
    'compile_cached': found.best.cached,  # compile_s was a load from the compilation cache
    'profile_dir': m.profile_dir,
  }
  if not m.finite:
    # A diverged run measures nothing worth reporting.
    for key in ('steps_per_s', 'units_per_s', 'tflops_per_s'):
      result['measurement'][key] = None
    return {**result, 'status': 'invalid', 'error': f'loss not finite after timing: {m.final_loss}'}
  if opts.scaling and program.devices > 1:
    progress.set_phase(f'timing one device at {result["max_batch"]} {w.unit}')
    log(f'  {w.name}: {progress.phase}, for the scaling')
    result['parallel']['scaling'] = scaling(
      w, cfg, policy, opts, found.max_examples, result['measurement']['units_per_s'], layout.size
    )
  return {**result, 'status': 'ok', 'error': None}


def scaling(w, cfg, policy, opts, n: int, units_per_s: float, devices: int) -> dict[str, Any]:
  """One device timed at n examples, the per-device batch of the run on `devices`; the
  scaling efficiency is units/s at N / (N x units/s at 1)."""
  one = mesh.Layout([jax.local_devices()[0]], opts.shard_optimizer)
  program = prog.Program(w, cfg, policy, seed=opts.seed, layout=one)
  try:
    compiled = program.compile(n)
    m = timing.measure(program, compiled, opts.warmup_steps, opts.steps, opts.windows)
  except Exception as e:  # e.g. ZeRO-1's batch with the whole optimizer state on one device
    prog.release()
    return {
      'source': 'same process',
      'units_per_s_1': None,
      'efficiency': None,
      'error': prog.first_line(e),
    }
  single = w.units_per_example(cfg) * m.examples / m.median_step_s
  return {
    'source': 'same process',
    'units_per_s_1': single,
    'efficiency': units_per_s / (devices * single),
    'error': None,
  }


def search_ended(
  result: dict[str, Any], found: search.Result, size: int, opts: Options
) -> dict[str, Any] | None:
  """Records the search's max batch (`size`: the batch units of one example) in `result`; the
  finished result where the search left no batch to time (an error, or out of memory), else
  None. Shared by the JAX and the PyTorch run."""
  result['max_examples'] = found.max_examples
  result['max_batch'] = found.max_examples * size
  if found.error is not None:
    return {**result, 'status': 'error', 'error': found.error}
  if found.best is None:
    return {
      **result,
      'status': 'oom',
      'error': 'not even one example fits' if opts.batch_size is None else found.trials[-1].detail,
    }
  return None


def trial_line(w: wl.Workload, t: search.Trial) -> str:
  peak = (
    '' if t.predicted_peak_bytes is None else f' peak {report.human_bytes(t.predicted_peak_bytes)}'
  )
  comp = '' if t.compile_s is None else f' compile {t.compile_s:.1f}s'
  why = f' ({t.detail})' if t.detail and not t.fits else ''
  level = '' if t.autotune_level is None else f' [autotune level {t.autotune_level}]'
  return f'  {w.name}: batch {t.batch} {w.unit}: {t.outcome}{peak}{comp}{level}{why}'


def probe_check_text(check: search.ProbeCheck) -> str:
  """The probe check in a few words, for the run's log: both forecasts where they differ."""
  if check.equal:
    return 'the same bytes'

  def shown(b: int | None) -> str:
    return 'no forecast' if b is None else f'{b:,} B'

  return (
    f"other bytes ({shown(check.peak_bytes)} against the probe's "
    f'{shown(check.probe_peak_bytes)}): the search went on autotuned'
  )


def _trials_text(w: wl.Workload, trials: list[search.Trial]) -> str:
  """'359 fits, 361 oom_predicted (earlier run 2026-12-01T04:52:30+00:00)'."""
  parts = [f'{t.batch} {t.outcome}' for t in sorted(trials, key=lambda t: t.examples)]
  runs = sorted({t.earlier for t in trials if t.earlier})
  return ', '.join(parts) + (f' ({w.unit}; earlier runs {", ".join(runs)})' if runs else '')


def on_gpu() -> bool:
  """Whether JAX runs on a GPU: without one --tiny defaults to on, so a CPU run ends in minutes."""
  return jax.devices()[0].platform == 'gpu'
