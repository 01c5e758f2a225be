"""The max-batch search: the largest batch whose train step compiles and runs.

Every probe compiles the jitted step at n examples and reads XLA's compile-time
memory analysis (the predicted peak). A probe whose prediction exceeds the
memory budget is out of memory without running; any other is run for real (as
it is found; or, with run_every_fit off, only the largest fit, once the search
has closed in on it), and an XLA RESOURCE_EXHAUSTED (or a cuDNN/cuBLAS
allocation failure) at compile or run time marks it out of memory. Any other
error stops the search and is reported as an error, never as an out-of-memory.

The peak is close to linear in the batch (peak = a + b * n), so after two
probes the search jumps to the predicted boundary and then confirms both sides,
falling back to doubling and bisection wherever the line is wrong (aim.py). It ends
when the largest fitting n and the smallest failing n are one example apart.

Any object with the Program interface can be searched (`.workload`, `.cfg`, `.compile(n)` ->
Compiled, `.run(compiled, steps)`): one without a forecast (peak_bytes None, no budget given, as
a PyTorch peer's program in jaxbench/pytorch/) is searched by doubling and bisection alone, every
probe run.

A search may start from the decided trials of an earlier run of the same program under the
same memory (`known`, --search_resume): a search whose compiles take minutes each can then
span several processes, each adding probes. The trials keep the time of the run that made
them; the batch reported is always compiled and run again by this search before it is timed.

With --probe_autotune_level, compile-only probes at a cheap autotuning level come first
(probing.py).
"""

import dataclasses
import time
from typing import Callable

from jaxbench.core import aim
from jaxbench.core import program as prog
from jaxbench.core.probe import DECIDED, ERROR, PhaseCallback, Trial, forecast_missed, probe, verify


@dataclasses.dataclass
class Result:
  max_examples: int  # 0 when not even one example fits
  trials: list[Trial]
  seconds: float
  budget_bytes: int | None
  best: prog.Compiled | None  # the compiled step at max_examples, kept for timing
  error: str | None = None
  # The search reached its max_examples with nothing failing: max_examples is a lower bound.
  capped: bool = False


def find_max_batch(
  program: prog.Program,
  budget_bytes: int | None,
  max_examples: int = 1 << 20,
  verify_predicted_oom: bool = False,
  on_trial: Callable[[Trial], None] | None = None,
  run_steps: int = 2,
  tolerance: float = 0.0,
  hints: dict[int, int] | None = None,
  on_phase: PhaseCallback | None = None,
  known: list[Trial] | None = None,
  run_every_fit: bool = True,
) -> Result:
  """Search the largest number of examples whose step fits; see the module docstring.

  run_steps=0 is the compile-only search (--predict): nothing runs, a batch fits when its
  predicted peak is within the budget, so the budget must be given. The search ends when the
  largest fit and the smallest failure are one example apart, or within `tolerance` x the fit.

  hints: n -> predicted peak from earlier compiles of the same program (hints.py). They aim the
  first probes (the first is the hinted boundary instead of one example), never decide: every
  fit and failure reported is a compile, and a run, of this search.

  known: decided trials of an earlier run of the same program under the same memory
  (hints.decided), where this search starts; they are reported with the others.

  run_every_fit: each probe predicted to fit runs run_steps steps at once (the default). Without
  it a fit is decided by its forecast, and only the largest one runs, once the search has
  closed in on it, as a trial of its own. For programs whose first step costs minutes of host
  work at every new batch. Once a forecast has been wrong (a fit by forecast out of memory when
  run), fits by forecast alone no longer count and every later fit runs as it is found; so too
  without a budget, or with verify_predicted_oom.

  Either way the max returned has run in this search: a largest fit from `known`, or one not
  yet run, is compiled (where it is not already) and run before the search returns. Should a
  fit that ran in an earlier run fail here, the search stops with an error rather than mix two
  runs that disagree.

  on_phase: told as each probe starts its compile and its run (see probe.COMPILING).
  """
  if run_steps == 0 and budget_bytes is None:
    raise ValueError('a compile-only search needs a memory budget')
  start = time.perf_counter()
  # The batches the workload runs: any below the multiple, else multiples of it (1: any).
  multiple = max(1, getattr(program.workload, 'batch_multiple', 1))
  if multiple > 1 and not aim.allowed(max_examples, multiple):
    max_examples -= max_examples % multiple
  # Earlier fits above the cap would make a max the cap forbids.
  trials = [t for t in known or [] if not (t.fits and t.examples > max_examples)]
  # Fits by forecast alone count until a forecast has been wrong.
  distrust = any(forecast_missed(t, budget_bytes) for t in trials)
  lazy = not run_every_fit and budget_bytes is not None and not verify_predicted_oom
  best: prog.Compiled | None = None  # the compiled step at the largest fit, if compiled here
  ran = False  # whether `best` has run in this search
  gallop, direction, line_missed = 1, None, False

  def deciding() -> list[Trial]:
    return [t for t in trials if not (distrust and t.fits and t.run_s is None)]

  def bracket() -> tuple[int, int | None]:
    """The largest n known to fit and the smallest known not to."""
    ts = deciding()
    lo = max((t.examples for t in ts if t.fits), default=0)
    hi = min((t.examples for t in ts if t.outcome in DECIDED and not t.fits), default=None)
    return lo, hi if hi is None or hi <= max_examples else None  # above the cap: the cap bounds

  def closed(lo: int, hi: int | None) -> bool:
    return aim.closed(lo, hi, tolerance, multiple) or lo >= max_examples

  def result(error: str | None = None) -> Result:
    lo, hi = bracket()
    if error is not None and run_steps:  # the largest batch that ran in this search
      lo = max(
        (t.examples for t in trials if t.fits and t.run_s is not None and not t.earlier), default=0
      )
    # Stopped by the cap rather than by a failure just above: the max is only a lower bound.
    capped = error is None and lo >= max_examples and (hi is None or hi > lo + 1)
    return Result(lo, trials, time.perf_counter() - start, budget_bytes, best, error, capped)

  def record(trial: Trial) -> None:
    nonlocal distrust
    trials.append(trial)
    distrust = distrust or forecast_missed(trial, budget_bytes)
    if on_trial:
      on_trial(trial)

  def aim_next(lo: int, hi: int | None, gallop: int, line_missed: bool) -> tuple[int, str | None]:
    """The next probe and its gallop's direction (aim.next_probe) from this search's trials."""
    return aim.next_probe(
      deciding(),
      budget_bytes,
      lo,
      hi,
      max_examples,
      gallop,
      line_missed,
      hints,
      tolerance,
      multiple,
    )

  lo, hi = bracket()
  if hi is not None and hi <= lo:
    raise ValueError(f'the earlier trials disagree: {lo} examples fit, {hi} did not')
  if lo or hi is not None:
    n, direction = aim_next(lo, hi, 1, False)
  else:
    aimed = aim.line_guess([], budget_bytes, 0, None, hints) if hints else None
    n = min(max(aimed, 1), max_examples) if aimed is not None else 1
    n = aim.snap(n, 0, max_examples + 1, multiple) or 1
  while True:
    if closed(lo, hi):
      if lo == 0 or run_steps == 0 or (best is not None and best.n == lo and ran):
        return result()
      # The largest fit has not run in this search: run it (compiled first where needed).
      if best is not None and best.n == lo:
        trial, compiled = verify(program, best, budget_bytes, run_steps, on_phase), best
      else:
        trial, compiled = probe(
          program, lo, budget_bytes, run_steps, verify_predicted_oom, on_phase
        )
      record(trial)
      if trial.outcome == ERROR:
        return result(trial.detail)
      if trial.fits:
        best, ran = compiled, True
        continue
      if any(t.earlier and t.fits and t.run_s is not None and t.examples == lo for t in trials):
        return result(f'{lo} examples ran in an earlier run and not in this one ({trial.outcome})')
      # Out of memory although its forecast fitted: from here on every fit runs, and the
      # line through the forecasts is not trusted near this boundary.
      best, ran = None, False
      gallop, direction, line_missed = 1, None, True
      lo, hi = bracket()
      if closed(lo, hi):
        continue
      n, direction = aim_next(lo, hi, gallop, line_missed)
    steps = 0 if lazy and not distrust else run_steps
    trial, compiled = probe(program, n, budget_bytes, steps, verify_predicted_oom, on_phase)
    record(trial)
    if trial.outcome == ERROR:
      return result(trial.detail)
    if trial.fits:
      best, ran = compiled, steps > 0
    lo, hi = bracket()
    if closed(lo, hi):
      continue
    # A gallop that stayed on its side (up and fitting, down and failing) doubles its step.
    kept_going = (direction == 'up' and trial.fits) or (direction == 'down' and not trial.fits)
    gallop = 2 * gallop if kept_going else 1
    line_missed = line_missed or (direction is not None and not kept_going)
    n, direction = aim_next(lo, hi, gallop, line_missed)
    if n <= lo or (hi is not None and n >= hi) or n in {t.examples for t in deciding()}:
      return result(f'search stalled at {n} (fits {lo}, fails {hi})')
