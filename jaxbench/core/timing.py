"""Throughput: warm-up, then timed windows that end on block_until_ready."""

import dataclasses
import statistics
import time

import jax
import numpy as np

from jaxbench.core import program as prog


@dataclasses.dataclass
class Measurement:
  """Step times of one compiled step at one batch, in seconds, one per window."""

  examples: int
  warmup_steps: int
  steps_per_window: int
  window_step_s: list[float]
  final_loss: float
  process_peak_bytes: int | None
  profile_dir: str | None = None  # where the trace of one more window went (jax.profiler)

  @property
  def finite(self) -> bool:
    return bool(np.isfinite(self.final_loss))

  @property
  def median_step_s(self) -> float:
    return statistics.median(self.window_step_s)

  @property
  def spread_pct(self) -> float:
    """(slowest - fastest window) / median, in percent."""
    return 100.0 * (max(self.window_step_s) - min(self.window_step_s)) / self.median_step_s


def measure(
  program: prog.Program,
  compiled: prog.Compiled,
  warmup_steps: int,
  steps: int,
  windows: int,
  profile_dir: str | None = None,
) -> Measurement:
  """Time `steps` steps in `windows` windows after `warmup_steps` untimed ones.

  With `profile_dir`, one more window of the same steps runs under jax.profiler.trace after the
  timed ones: a trace of what a timed window runs (TensorBoard's profile plugin or Perfetto read
  it), kept out of the figures, which the profiler's own work would slow.

  The batch is built once on the device and reused; the transfer guard proves
  that the timed loop moves nothing between host and device. Each window ends
  with block_until_ready on the last step's output, not every step, so the
  host keeps the device's queue full. The steps run in a worker thread (program._interruptible),
  so that a SIGINT while timing is seen without waiting for the device.
  """
  per_window = max(1, steps // windows)
  times, loss = prog._interruptible(
    _timed_windows, program, compiled, warmup_steps, per_window, windows, profile_dir
  )
  stats = prog.device_memory()
  return Measurement(
    examples=compiled.n,
    warmup_steps=warmup_steps,
    steps_per_window=per_window,
    window_step_s=times,
    final_loss=loss,
    process_peak_bytes=stats.get('peak_bytes_in_use') if stats else None,
    profile_dir=profile_dir,
  )


def _timed_windows(program, compiled, warmup_steps, per_window, windows, profile_dir=None):
  """Each window's seconds per step, and the last loss; a traced window after them with
  `profile_dir`."""
  state, batch = program.materialize(compiled.n)
  run = compiled.executable
  rng = program.rng
  metrics = None
  times = []
  try:
    with jax.transfer_guard('disallow'):
      for _ in range(warmup_steps):
        state, metrics = run(state, batch, rng)
      jax.block_until_ready((state, metrics))
      for _ in range(windows):
        start = time.perf_counter()
        for _ in range(per_window):
          state, metrics = run(state, batch, rng)
        jax.block_until_ready(metrics)
        times.append((time.perf_counter() - start) / per_window)
      if profile_dir:
        with jax.profiler.trace(profile_dir):
          for _ in range(per_window):
            state, metrics = run(state, batch, rng)
          jax.block_until_ready(metrics)
    loss = float(np.asarray(metrics['loss']))
  finally:
    del state, batch
  return times, loss
