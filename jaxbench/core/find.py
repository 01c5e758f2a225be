"""The batch a run times: its fixed batch, or the max-batch search its options ask for."""

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jaxbench.core import hints, probe, probing, run_record, search, search_log
from jaxbench.core import program as prog
from models import workload as wl

if TYPE_CHECKING:  # bench runs the search from here
  from jaxbench.core import bench


def batch(
  w: wl.Workload,
  cfg: wl.Config,
  opts: 'bench.Options',
  program: prog.Program,
  budget: int | None,
  result: dict[str, Any],
  progress: run_record.Progress,
  log: Callable[[str], None],
) -> search.Result:
  """The batch to time: opts.batch_size's one trial, or the max the search finds. Each phase
  and trial goes to the log and to `progress` as it comes; result['search'] records how the
  search was asked for."""
  r = _Run(w, cfg, opts, program, budget, result, progress, log)
  return _search(r) if opts.batch_size is None else _fixed(r)


@dataclasses.dataclass
class _Run:
  """A run's search under way: what it measures, its result so far, and where it reports (the
  log, and the live line and the checkpoint through `progress`)."""

  w: wl.Workload
  cfg: wl.Config
  opts: 'bench.Options'
  program: prog.Program
  budget: int | None
  result: dict[str, Any]
  progress: run_record.Progress
  log: Callable[[str], None]

  def on_trial(self, t: probe.Trial) -> None:
    self.progress.add(t)
    self.progress.running = None
    if self.program.init_s is not None:  # the first trial that ran built the initial state
      self.result['init_s'] = round(self.program.init_s, 3)
      self.result['init_cached'] = self.program.init_cached
      self.result['init_pooled'] = self.program.init_pooled
    self.progress.changed()  # before the line: a log that shows a trial has it in the checkpoint
    self.log(search_log.trial_line(self.w, t))

  def on_phase(self, n: int, phase: str, trial: probe.Trial | None) -> None:
    # Where the run is, in the log (runner's log flushes: a log cut by a deadline's SIGKILL
    # still shows the phase) and in an interrupted result's error and trials (a probe cut in
    # its run keeps its compile time and forecast there, as outcome 'unfinished').
    self.progress.running = trial
    compile_s = None if trial is None else trial.compile_s
    batch = f'{n * self.w.example_size(self.cfg)} {self.w.unit}'
    shown = f'{phase} batch {batch}'
    if trial is not None and self.program.init_s is None:
      shown = f'building the initial state, then {shown}'  # the first run builds it
    if self.opts.batch_size is None:
      self.progress.set_phase(f'searching: {phase} batch {batch}', shown)
    else:
      self.progress.set_phase(f'{phase} the fixed batch ({batch})', shown)
    what = phase if compile_s is None else f'compiled in {compile_s:.1f} s, {phase}'
    self.progress.changed()
    self.log(f'  {self.w.name}: batch {batch}: {what}')


def _fixed(r: _Run) -> search.Result:
  """The fixed batch (--batch_size) as the search's one trial."""
  r.result['search'] = {'mode': 'fixed'}
  # --batch_size is global
  n = run_record.examples_for(r.w, r.cfg, r.opts.batch_size) // r.program.devices
  start = time.perf_counter()
  trial, compiled = probe.probe(
    r.program, n, r.budget, verify_predicted_oom=r.opts.verify_predicted_oom, on_phase=r.on_phase
  )
  r.on_trial(trial)
  return search.Result(
    n if trial.fits else 0,
    [trial],
    time.perf_counter() - start,
    r.budget,
    compiled,
    trial.detail if trial.outcome == probe.ERROR else None,
  )


def _search(r: _Run) -> search.Result:
  """The max-batch search: aimed by --search_hints, from the trials --search_resume takes, by
  compile-only probes first with --probe_autotune_level."""
  opts = r.opts
  peaks, matched, other_jax = hints.load(opts.search_hints, r.result)
  r.result['search'] = {
    'mode': 'search',
    'tolerance': opts.search_tolerance,
    'hints': hints.summary(opts.search_hints, matched, peaks, other_jax),
    'run_every_fit': opts.run_every_fit,
  }
  known = _resumed(r) if opts.search_resume else []
  if opts.probe_autotune_level is not None and r.budget is None:
    r.log(f'  {r.w.name}: no memory budget known, so no compile-only probes: searched autotuned')
  if opts.probe_autotune_level is not None and r.budget is not None:
    return _probing(r, peaks)
  return search.find_max_batch(
    r.program,
    r.budget,
    opts.max_examples,
    opts.verify_predicted_oom,
    on_trial=r.on_trial,
    tolerance=opts.search_tolerance,
    hints=peaks,
    on_phase=r.on_phase,
    known=known,
    run_every_fit=opts.run_every_fit,
  )


def _resumed(r: _Run) -> list[probe.Trial]:
  """The earlier trials a resumed search starts from (--search_resume), logged and recorded."""
  opts, w = r.opts, r.w
  known = hints.decided(opts.search_hints, r.result, r.budget)
  ran = len(known)
  if r.budget is not None and not opts.verify_predicted_oom:
    # A forecast is the program's, whatever memory its compile had: every earlier one (a
    # --predict's too) says what compiling its batch again would find under this budget.
    # Fits by forecast count only where this search decides fits so (--norun_every_fit).
    by_forecast = hints.forecast_trials(
      hints.forecasts(opts.search_hints, r.result),
      r.budget,
      w.example_size(r.cfg),
      opts.max_examples,
    )
    if opts.run_every_fit:
      by_forecast = [t for t in by_forecast if not t.fits]
    known = hints.combined(known, by_forecast)
  r.result['search']['resumed'] = {
    'trials': len(known),
    'by_forecast': len(known) - ran,
    'runs': sorted({t.earlier for t in known}),
  }
  for t in known:
    r.progress.add(t)
  if known:
    r.log(
      f'  {w.name}: resumed from {len(known)} earlier trials: ' + search_log.trials_text(w, known)
    )
  return known


def _probing(r: _Run, peaks: dict[int, int]) -> search.Result:
  """The search by compile-only probes at --probe_autotune_level, its check recorded."""
  level, w = r.opts.probe_autotune_level, r.w
  found, check = probing.find_max_batch_probing(
    r.program,
    r.program.autotuned_at(level),
    level,
    r.budget,
    r.opts.max_examples,
    on_trial=r.on_trial,
    tolerance=r.opts.search_tolerance,
    hints=peaks,
    on_phase=r.on_phase,
    run_every_fit=r.opts.run_every_fit,
  )
  r.result['search']['probe'] = {
    'autotune_level': level,
    'check': None if check is None else dataclasses.asdict(check),
  }
  if check is not None:
    n = check.examples * w.example_size(r.cfg)
    r.log(f'  {w.name}: autotuned at {n} {w.unit}: {search_log.probe_check_text(check)}')
  return found
