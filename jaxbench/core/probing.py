"""The max-batch search by cheap compile-only probes, then one compile at the run's autotuning."""

import dataclasses
import time
from typing import Callable

from jaxbench.core import program as prog
from jaxbench.core import search
from jaxbench.core.probe import DECIDED, ERROR, PhaseCallback, Trial, probe


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
) -> tuple[search.Result, ProbeCheck | None]:
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
  first = search.find_max_batch(
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
    return search.Result(
      0, first.trials + [trial], time.perf_counter() - start, budget_bytes, None, trial.detail
    ), check
  if check.equal and trial.fits and (trial.run_s is not None or not run_steps):
    return search.Result(
      n,
      first.trials + [trial],
      time.perf_counter() - start,
      budget_bytes,
      compiled,
      capped=first.capped,
    ), check
  aims = {**(hints or {})}
  aims.update({t.examples: t.predicted_peak_bytes for t in first.trials if t.predicted_peak_bytes})
  second = search.find_max_batch(
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
