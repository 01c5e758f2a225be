"""One probe of the max-batch search: the train step compiled at n examples, its memory
forecast read, and unless that forecast is over the budget, two steps run; the trial says what
happened (fits, out of memory at compile or run time, predicted out of memory, an error).

An XLA RESOURCE_EXHAUSTED (or a cuDNN/cuBLAS allocation failure) at compile or run time marks a
probe out of memory; any other exception is an error, never an out-of-memory. The search
(jaxbench/core/search.py) decides which batches to probe.
"""

import dataclasses
import time
from typing import Callable

from jaxbench.core import program as prog

FITS, OOM_PREDICTED, OOM_COMPILE, OOM_RUN, ERROR = (
  'fits',
  'oom_predicted',
  'oom_compile',
  'oom_run',
  'error',
)
# A probe that compiled (its forecast is known) and was stopped during its run: only in the
# record of an interrupted run, never decided.
UNFINISHED = 'unfinished'
DECIDED = (FITS, OOM_PREDICTED, OOM_COMPILE, OOM_RUN)


@dataclasses.dataclass
class Trial:
  """One probe of the search, as reported."""

  examples: int
  batch: int  # in the workload's batch unit
  outcome: str  # one of DECIDED, ERROR or UNFINISHED
  predicted_peak_bytes: int | None = None
  predicted_temp_bytes: int | None = None  # XLA's temporaries (activations and the like)
  compile_s: float | None = None
  run_s: float | None = None
  detail: str = ''
  process_peak_bytes: int | None = None  # the allocator's peak so far (GPU only)
  # Device bytes still in use after the trial was released: equal before and
  # after every trial when nothing leaks (GPU only).
  bytes_in_use_after: int | None = None
  # The timestamp of the earlier run that made this trial (--search_resume); None: this run.
  earlier: str | None = None
  # The step came from the persistent compilation cache: compile_s is a load, not a compile.
  cached: bool = False
  # Compiled with XLA's autotuning at this level instead of the run's own (a compile-only probe
  # of probing.find_max_batch_probing: another program, whose forecast aims and decides this
  # search only); None: the run's program.
  autotune_level: int | None = None

  @property
  def fits(self) -> bool:
    return self.outcome == FITS


# on_phase(n, COMPILING, None) as a probe's compile starts, on_phase(n, RUNNING, trial) as its
# run starts, the trial holding its compile time and forecast: for a log that shows where a long
# search is (either can take minutes on a GPU), and for the record of a run stopped there.
COMPILING, RUNNING = 'compiling', 'running'
PhaseCallback = Callable[[int, str, 'Trial | None'], None]


def _no_phase(n: int, phase: str, trial: 'Trial | None') -> None:
  del n, phase, trial


def probe(
  program: prog.Program,
  n: int,
  budget_bytes: int | None,
  run_steps: int = 2,
  verify_predicted_oom: bool = False,
  on_phase: PhaseCallback | None = None,
) -> tuple[Trial, prog.Compiled | None]:
  """Compile (and unless predicted out of memory, or run_steps is 0, run) the step at n
  examples. Returns the trial and, where it fits, the compiled step."""
  trial, compiled = _probe(
    program, n, budget_bytes, run_steps, verify_predicted_oom, on_phase or _no_phase
  )
  _after(program, trial)
  return trial, compiled


def verify(
  program: prog.Program,
  compiled: prog.Compiled,
  budget_bytes: int | None,
  run_steps: int = 2,
  on_phase: PhaseCallback | None = None,
) -> Trial:
  """Run a step compiled earlier in this search (and predicted to fit), as its own trial: one
  with a run and no compile."""
  n = compiled.n
  trial = Trial(
    n,
    n * program.workload.example_size(program.cfg),
    FITS,
    predicted_peak_bytes=compiled.peak_bytes,
    predicted_temp_bytes=compiled.temp_bytes,
  )
  _run(program, compiled, trial, budget_bytes, run_steps, on_phase or _no_phase)
  _after(program, trial)
  return trial


def _device_memory(program) -> dict[str, int] | None:
  """The allocator's statistics: the program's own where it has them (a PyTorch program's),
  else JAX's."""
  own = getattr(program, 'device_memory', None)
  return own() if own is not None else prog.device_memory()


def _after(program, trial: Trial) -> None:
  stats = _device_memory(program)
  if stats:
    trial.bytes_in_use_after = stats.get('bytes_in_use')


def _probe(program, n, budget_bytes, run_steps, verify_predicted_oom, on_phase):
  batch = n * program.workload.example_size(program.cfg)
  on_phase(n, COMPILING, None)
  try:
    compiled = program.compile(n)
  except Exception as e:  # pylint: disable=broad-except
    outcome = OOM_COMPILE if prog.is_oom(e) else ERROR
    detail = prog.first_line(e)
    e.__traceback__ = None  # the traceback would pin the failed trial's buffers
    del e
    prog.release()
    return Trial(n, batch, outcome, detail=detail), None
  trial = Trial(
    n,
    batch,
    FITS,
    predicted_peak_bytes=compiled.peak_bytes,
    predicted_temp_bytes=compiled.temp_bytes,
    compile_s=None if compiled.compile_s is None else round(compiled.compile_s, 3),
    cached=compiled.cached,
  )
  over = budget_bytes is not None and (compiled.peak_bytes or 0) > budget_bytes
  if over and not verify_predicted_oom:
    trial.outcome = OOM_PREDICTED
    trial.detail = (
      f'predicted peak {compiled.peak_bytes / 1e9:.3f} GB > budget {budget_bytes / 1e9:.3f} GB'
    )
    return trial, None
  if run_steps == 0:
    return trial, compiled  # compile-only: fits means "predicted to fit" (run_s None)
  _run(program, compiled, trial, budget_bytes, run_steps, on_phase)
  return trial, compiled if trial.fits else None


def _run(program, compiled, trial, budget_bytes, run_steps, on_phase) -> None:
  """Run `compiled` for run_steps steps from a fresh state; the outcome goes into `trial`."""
  on_phase(trial.examples, RUNNING, dataclasses.replace(trial, outcome=UNFINISHED))
  start = time.perf_counter()
  try:
    program.run(compiled, run_steps)
  except Exception as e:  # pylint: disable=broad-except
    trial.outcome = OOM_RUN if prog.is_oom(e) else ERROR
    trial.detail = prog.first_line(e)
    e.__traceback__ = None
    del e
    prog.release()
  # Not in a `finally`: after a KeyboardInterrupt the abandoned run may still hold the device,
  # and the interrupted search must write its result without waiting on the allocator.
  trial.run_s = round(time.perf_counter() - start, 3)
  stats = _device_memory(program)
  trial.process_peak_bytes = stats.get('peak_bytes_in_use') if stats else None
  if trial.fits and budget_bytes is not None and (compiled.peak_bytes or 0) > budget_bytes:
    trial.outcome = OOM_PREDICTED  # ran anyway (verify_predicted_oom) but over the budget
    trial.detail = 'ran although predicted over budget; the budget is the limit that counts'


def forecast_missed(trial: Trial, budget: int | None) -> bool:
  """Predicted to fit, and out of memory when run: the forecast is wrong at this batch."""
  peak = trial.predicted_peak_bytes
  return trial.outcome == OOM_RUN and peak is not None and (budget is None or peak <= budget)
