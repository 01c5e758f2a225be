"""The max-batch search: the largest batch whose train step compiles and runs.

Every probe compiles the jitted step at n examples and reads XLA's compile-time
memory analysis (the predicted peak). A probe whose prediction exceeds the
memory budget is out of memory without running; any other is run for real, and
an XLA RESOURCE_EXHAUSTED (or a cuDNN/cuBLAS allocation failure) at compile or
run time marks it out of memory. Any other error stops the search and is
reported as an error, never as an out-of-memory.

The peak is close to linear in the batch (peak = a + b * n), so after two
probes the search jumps to the predicted boundary and then confirms both sides,
falling back to doubling and bisection wherever the line is wrong. It ends when
the largest fitting n and the smallest failing n are one example apart.
"""

import dataclasses
import time
from typing import Callable

from jaxbench import program as prog

FITS, OOM_PREDICTED, OOM_COMPILE, OOM_RUN, ERROR = (
    'fits', 'oom_predicted', 'oom_compile', 'oom_run', 'error')


@dataclasses.dataclass
class Trial:
  """One probe of the search, as reported."""

  examples: int
  batch: int  # in the workload's batch unit
  outcome: str  # one of FITS, OOM_PREDICTED, OOM_COMPILE, OOM_RUN, ERROR
  predicted_peak_bytes: int | None = None
  compile_s: float | None = None
  run_s: float | None = None
  detail: str = ''
  process_peak_bytes: int | None = None  # the allocator's peak so far (GPU only)

  @property
  def fits(self) -> bool:
    return self.outcome == FITS


@dataclasses.dataclass
class Result:
  max_examples: int  # 0 when not even one example fits
  trials: list[Trial]
  seconds: float
  budget_bytes: int | None
  best: prog.Compiled | None  # the compiled step at max_examples, kept for timing
  error: str | None = None


def probe(program: prog.Program, n: int, budget_bytes: int | None, run_steps: int = 2,
          verify_predicted_oom: bool = False) -> tuple[Trial, prog.Compiled | None]:
  """Compile (and unless predicted out of memory, run) the step at n examples."""
  batch = n * program.workload.example_size(program.cfg)
  try:
    compiled = program.compile(n)
  except Exception as e:  # pylint: disable=broad-except
    outcome = OOM_COMPILE if prog.is_oom(e) else ERROR
    detail = prog.first_line(e)
    e.__traceback__ = None  # the traceback would pin the failed trial's buffers
    del e
    prog.release()
    return Trial(n, batch, outcome, detail=detail), None
  trial = Trial(n, batch, FITS, predicted_peak_bytes=compiled.peak_bytes,
                compile_s=round(compiled.compile_s, 3))
  if budget_bytes is not None and compiled.peak_bytes > budget_bytes and not verify_predicted_oom:
    trial.outcome = OOM_PREDICTED
    trial.detail = f'predicted peak {compiled.peak_bytes / 1e9:.3f} GB > budget {budget_bytes / 1e9:.3f} GB'
    return trial, None
  start = time.perf_counter()
  try:
    program.run(compiled, run_steps)
  except Exception as e:  # pylint: disable=broad-except
    trial.outcome = OOM_RUN if prog.is_oom(e) else ERROR
    trial.detail = prog.first_line(e)
    e.__traceback__ = None
    del e
    prog.release()
    return trial, None
  finally:
    trial.run_s = round(time.perf_counter() - start, 3)
    stats = prog.device_memory()
    trial.process_peak_bytes = stats.get('peak_bytes_in_use') if stats else None
  if budget_bytes is not None and compiled.peak_bytes > budget_bytes:
    trial.outcome = OOM_PREDICTED  # ran anyway (verify_predicted_oom) but over the budget
    trial.detail = 'ran although predicted over budget; the budget is the limit that counts'
    return trial, None
  return trial, compiled


def _line_guess(trials: list[Trial], budget: int | None, lo: int, hi: int | None) -> int | None:
  """The largest n whose predicted peak fits, from a line through two probes near the boundary."""
  points = sorted({t.examples: t.predicted_peak_bytes for t in trials
                   if t.predicted_peak_bytes}.items())
  if budget is None or len(points) < 2:
    return None
  below = [p for p in points if p[0] <= lo]
  above = [p for p in points if hi is not None and p[0] >= hi]
  (n0, p0), (n1, p1) = (below[-1], above[0]) if below and above else points[-2:]
  slope = (p1 - p0) / (n1 - n0)
  if slope <= 0:
    return None
  return int(n0 + (budget - p0) // slope)


def find_max_batch(program: prog.Program, budget_bytes: int | None, max_examples: int = 1 << 20,
                   verify_predicted_oom: bool = False,
                   on_trial: Callable[[Trial], None] | None = None) -> Result:
  """Search the largest number of examples whose step fits; see the module docstring."""
  start = time.perf_counter()
  trials: list[Trial] = []
  best: prog.Compiled | None = None
  lo, hi = 0, None  # largest n known to fit, smallest n known not to
  model_steps = 0  # consecutive guesses from the line that left the bracket wide
  n = 1
  while True:
    trial, compiled = probe(program, n, budget_bytes, verify_predicted_oom=verify_predicted_oom)
    trials.append(trial)
    if on_trial:
      on_trial(trial)
    if trial.outcome == ERROR:
      return Result(lo, trials, time.perf_counter() - start, budget_bytes, best, trial.detail)
    if trial.fits:
      lo, best = n, compiled
    else:
      hi = n if hi is None else min(hi, n)
    if (hi is not None and hi - lo <= 1) or lo >= max_examples:
      return Result(lo, trials, time.perf_counter() - start, budget_bytes, best)
    guess = _line_guess(trials, budget_bytes, lo, hi)
    upper = max_examples + 1 if hi is None else hi
    if lo == 0:
      n = 0  # not even one example fits: the loop ended above (hi == 1)
    elif guess is not None and model_steps < 2:
      # Jump to the predicted boundary, but always into the open bracket, and
      # onto its failing side when the line says lo is already the boundary.
      n = min(max(guess, lo + 1), upper - 1)
      model_steps += 1
    elif hi is None:
      n = min(2 * lo, max_examples)  # doubling
    else:
      n = (lo + hi) // 2  # bisection
      model_steps = 0
    if n in {t.examples for t in trials}:
      n = (lo + upper) // 2 if hi is not None else min(2 * lo, max_examples)
    if n <= lo:
      return Result(lo, trials, time.perf_counter() - start, budget_bytes, best)
