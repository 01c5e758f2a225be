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
falling back to doubling and bisection wherever the line is wrong. It ends when
the largest fitting n and the smallest failing n are one example apart.

Any object with the Program interface can be searched (`.workload`, `.cfg`, `.compile(n)` ->
Compiled, `.run(compiled, steps)`): one without a forecast (peak_bytes None, no budget given, as
a PyTorch peer's program in jaxbench/pytorch/) is searched by doubling and bisection alone, every
probe run.

A search may start from the decided trials of an earlier run of the same program under the
same memory (`known`, --search_resume): a search whose compiles take minutes each can then
span several processes, each adding probes. The trials keep the time of the run that made
them; the batch reported is always compiled and run again by this search before it is timed.
"""

import dataclasses
import time
from typing import Callable

from jaxbench.core import program as prog

# The probe's names, used by the search's callers as search.X.
from jaxbench.core.probe import COMPILING as COMPILING
from jaxbench.core.probe import DECIDED as DECIDED
from jaxbench.core.probe import ERROR as ERROR
from jaxbench.core.probe import FITS as FITS
from jaxbench.core.probe import OOM_COMPILE as OOM_COMPILE
from jaxbench.core.probe import OOM_PREDICTED as OOM_PREDICTED
from jaxbench.core.probe import OOM_RUN as OOM_RUN
from jaxbench.core.probe import RUNNING as RUNNING
from jaxbench.core.probe import UNFINISHED as UNFINISHED
from jaxbench.core.probe import PhaseCallback as PhaseCallback
from jaxbench.core.probe import Trial as Trial
from jaxbench.core.probe import forecast_missed, probe, verify


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


def _line_guess(
  trials: list[Trial],
  budget: int | None,
  lo: int,
  hi: int | None,
  hints: dict[int, int] | None = None,
) -> int | None:
  """The largest n whose predicted peak fits the budget, from the probes so far.

  With a bracket, interpolate between its two ends (regula falsi: the guess
  stays inside). Without one, and with hints (predicted peaks from earlier
  searches), take the line through the known points nearest the budget.
  Without hints, extrapolate from the two largest fits; after the first probe
  alone, assume all of its temporaries scale with the batch: an over-estimate
  of the per-example memory, so the guess is short of the boundary but lands
  on the linear part of the curve, far from the fixed costs (parameters,
  optimizer state) that dominate at one example.
  """
  if budget is None:
    return None
  peaks = {t.examples: t.predicted_peak_bytes for t in trials if t.predicted_peak_bytes}
  if lo in peaks and hi in peaks:
    (n0, p0), (n1, p1) = (lo, peaks[lo]), (hi, peaks[hi])
  elif hints and len(hints) >= 2 and any(hints.get(n, p) != p for n, p in peaks.items()):
    # The hints disagree with this search's own forecast at a batch both have: they come from
    # another compile (deviceless, without autotuning), a few percent off in level, and a line
    # through one of theirs and one of ours would aim far off (simulated with stylegan bf16's
    # deviceless hints and its fp32 gap of 4.8%: 166 images over, then 165, a probe wasted).
    # So: our forecast nearest the budget, and the hints' slope over their whole range.
    n0, p0 = min(peaks.items(), key=lambda pt: abs(pt[1] - budget))
    (a, pa), (b, pb) = min(hints.items()), max(hints.items())
    (n1, p1) = (n0 + 1, p0 + (pb - pa) / (b - a))
  elif hints and len({**hints, **peaks}) >= 2:
    (n0, p0), (n1, p1) = _nearest_pair({**hints, **peaks}, budget)
  else:
    fits = sorted((n, p) for n, p in peaks.items() if n <= lo)
    if len(fits) >= 2:
      (n0, p0), (n1, p1) = fits[-2:]
    elif len(fits) == 1:
      first = next(t for t in trials if t.examples == fits[0][0])
      per_example = max(first.predicted_temp_bytes or 0, 1)
      return fits[0][0] + max(int((budget - fits[0][1]) // per_example), 1)
    else:
      return None
  slope = (p1 - p0) / (n1 - n0)
  if slope <= 0:
    return None
  return int(n0 + (budget - p0) // slope)


def _nearest_pair(peaks: dict[int, int], budget: int) -> tuple[tuple[int, int], tuple[int, int]]:
  """Two (n, peak) points to draw the line through: the largest under the budget and the
  smallest over it; with points on one side only, the nearest one and the farthest (a long
  baseline, so that a few GB of noise in XLA's forecast moves the slope little)."""
  points = sorted(peaks.items())
  under = [pt for pt in points if pt[1] <= budget]
  over = [pt for pt in points if pt[1] > budget]
  if under and over:
    return under[-1], over[0]
  if under:
    return under[0], under[-1]
  return over[0], over[-1]


def _next_probe(
  trials: list[Trial],
  budget: int | None,
  lo: int,
  hi: int | None,
  max_examples: int,
  gallop: int,
  line_missed: bool,
  hints: dict[int, int] | None = None,
) -> tuple[int, str | None]:
  """Where to probe next, given the largest fit `lo` and smallest failure `hi`.

  The line's guess when it falls strictly inside the bracket. When the line
  points at or beyond an edge of the bracket, gallop from that edge (steps 1,
  2, 4, ... so a boundary just beside a probe costs a few probes), never past
  the middle. Without a line, or once a gallop has crossed the boundary (the
  line is wrong here): doubling, then bisection. Returns n and the
  gallop's direction ('up' from lo, 'down' from hi, or None).
  """
  probed = {t.examples for t in trials}
  guess = _line_guess(trials, budget, lo, hi, hints)
  inside = guess is not None and guess > lo and (hi is None or guess < hi)
  if guess is None or (line_missed and not inside):
    return (min(2 * lo, max_examples) if hi is None else (lo + hi) // 2), None
  if guess > lo and (hi is None or guess < hi) and guess not in probed:
    return min(guess, max_examples), None
  if hi is None:
    return min(lo + gallop, max_examples), 'up'
  mid = (lo + hi) // 2
  if guess <= lo:
    return max(min(lo + gallop, mid), lo + 1), 'up'
  return min(max(hi - gallop, mid), hi - 1), 'down'


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

  on_phase: told as each probe starts its compile and its run (see COMPILING).
  """
  if run_steps == 0 and budget_bytes is None:
    raise ValueError('a compile-only search needs a memory budget')
  start = time.perf_counter()
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
    return (hi is not None and hi - lo <= max(1, int(tolerance * lo))) or lo >= max_examples

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

  lo, hi = bracket()
  if hi is not None and hi <= lo:
    raise ValueError(f'the earlier trials disagree: {lo} examples fit, {hi} did not')
  if lo or hi is not None:
    n, direction = _next_probe(deciding(), budget_bytes, lo, hi, max_examples, 1, False, hints)
  else:
    aimed = _line_guess([], budget_bytes, 0, None, hints) if hints else None
    n = min(max(aimed, 1), max_examples) if aimed is not None else 1
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
      n, direction = _next_probe(
        deciding(), budget_bytes, lo, hi, max_examples, gallop, line_missed, hints
      )
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
    n, direction = _next_probe(
      deciding(), budget_bytes, lo, hi, max_examples, gallop, line_missed, hints
    )
    if n <= lo or (hi is not None and n >= hi) or n in {t.examples for t in deciding()}:
      return result(f'search stalled at {n} (fits {lo}, fails {hi})')


@dataclasses.dataclass
class ProbeCheck:
  """The batch the cheap probes found, compiled again with the run's own autotuning: both
  forecasts, and whether they agree byte for byte (then the probes' out-of-memory bound above
  it stands for the run's program too)."""

  examples: int
  probe_peak_bytes: int | None
  peak_bytes: int | None
  equal: bool


def find_max_batch_probing(
  program: prog.Program,
  probe_program: prog.Program,
  level: int,
  budget_bytes: int,
  max_examples: int = 1 << 20,
  on_trial: Callable[[Trial], None] | None = None,
  run_steps: int = 2,
  tolerance: float = 0.0,
  hints: dict[int, int] | None = None,
  on_phase: PhaseCallback | None = None,
  run_every_fit: bool = True,
) -> tuple[Result, ProbeCheck | None]:
  """The max batch searched with cheap probes, and only the batch they find compiled and run
  with the program's own autotuning (--probe_autotune_level).

  probe_program is the same step compiled with XLA's autotuning at `level` (0: off): its
  compile-only search (run_steps 0, decided by forecast) costs seconds a probe where autotuning
  a convolution network at a full-memory batch costs many minutes (deeplabv3 bf16 on the H200:
  21 s at level 0 against 131 s autotuned at 8 images, and more than 550 s at 166, its
  candidates' run times growing with the batch). Then `program` compiles the max it found. If
  that compile forecasts the same bytes as the probe's, it is run (and so decided), and the
  probes' out-of-memory bound above it stands: the search is done with one autotuned compile.
  The equality is checked, not assumed, at that batch; that it holds one example above too is
  the assumption. On the H200 the levels forecast the same bytes for deeplabv3 bf16 at 8 images
  (7,196,019,536 B at level 0 and at level 4) and yolov3 fp32 at 187 (levels 1 and 4), and not for
  pix2pixhd fp32 at one image (13.10 GB at level 0, 14.05 GB autotuned: the algorithms the
  autotuner picks have larger workspaces). If the two forecasts differ, or the batch fails its
  run, the probes decide nothing more: the search goes on with `program` alone from that trial,
  aimed by every forecast so far (the probes' line, offset to this compile's own forecast).
  Returns the result (every probe's trial marked with its autotune_level) and the check (None
  when nothing fitted the probes or they stopped on an error).
  """

  def tagged(t: Trial) -> None:
    t.autotune_level = level
    if on_trial:
      on_trial(t)

  def probe_phase(n: int, phase: str, trial: Trial | None) -> None:
    if on_phase:
      on_phase(n, f'{phase} (autotune level {level})', trial)

  start = time.perf_counter()
  first = find_max_batch(
    probe_program,
    budget_bytes,
    max_examples,
    on_trial=tagged,
    run_steps=0,
    tolerance=tolerance,
    hints=hints,
    on_phase=probe_phase,
  )
  if first.error is not None or first.max_examples == 0:
    return dataclasses.replace(first, best=None, seconds=time.perf_counter() - start), None
  n = first.max_examples
  forecast = next(t.predicted_peak_bytes for t in first.trials if t.examples == n and t.fits)
  trial, compiled = probe(program, n, budget_bytes, run_steps, False, on_phase)
  if on_trial:
    on_trial(trial)
  check = ProbeCheck(
    n, forecast, trial.predicted_peak_bytes, trial.predicted_peak_bytes == forecast
  )
  if trial.outcome == ERROR:
    return Result(
      0, first.trials + [trial], time.perf_counter() - start, budget_bytes, None, trial.detail
    ), check
  if check.equal and trial.fits and (trial.run_s is not None or not run_steps):
    return Result(
      n,
      first.trials + [trial],
      time.perf_counter() - start,
      budget_bytes,
      compiled,
      capped=first.capped,
    ), check
  aims = {**(hints or {})}
  aims.update({t.examples: t.predicted_peak_bytes for t in first.trials if t.predicted_peak_bytes})
  second = find_max_batch(
    program,
    budget_bytes,
    max_examples,
    on_trial=on_trial,
    run_steps=run_steps,
    tolerance=tolerance,
    hints=aims,
    on_phase=on_phase,
    known=[trial] if trial.outcome in DECIDED else [],
    run_every_fit=run_every_fit,
  )
  return dataclasses.replace(
    second, trials=first.trials + second.trials, seconds=time.perf_counter() - start
  ), check
