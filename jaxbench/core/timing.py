"""Throughput: warm-up, then timed windows that end on block_until_ready."""

import dataclasses
import statistics
import time

import jax
import numpy as np

from jaxbench.core import kernel_time
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
  profile: dict | None = None  # that window's GPU time per step (kernel_time.summarize)

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
  it), kept out of the figures, which the profiler's own work would slow. Its GPU kernels are
  summed per step into the measurement's `profile` (kernel_time.py).

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
  profile = None
  if profile_dir:
    profile = kernel_time.of_window(profile_dir, compiled.executable.as_text(), per_window)
  return Measurement(
    examples=compiled.n,
    warmup_steps=warmup_steps,
    steps_per_window=per_window,
    window_step_s=times,
    final_loss=loss,
    process_peak_bytes=stats.get('peak_bytes_in_use') if stats else None,
    profile_dir=profile_dir,
    profile=profile,
  )


def windows(step, sync, warmup_steps: int, per_window: int, windows: int):
  """Seconds per call of `step()` in each of `windows` windows of `per_window` calls, after
  `warmup_steps` untimed calls; the last call's output; and the seconds of the first warm-up call
  to its sync (a first call that compiles or autotunes: its compile), None without warm-up.

  A window ends on `sync` of its last output (jax.block_until_ready, a CUDA synchronize), not on
  each call, so that the host keeps the device's queue full. Both frameworks time through here.
  """
  out, first_s = None, None
  for k in range(warmup_steps):
    start = time.perf_counter()
    out = step()
    if k == 0:
      sync(out)
      first_s = time.perf_counter() - start
  sync(out)
  times = []
  for _ in range(windows):
    start = time.perf_counter()
    for _ in range(per_window):
      out = step()
    sync(out)
    times.append((time.perf_counter() - start) / per_window)
  return times, out, first_s


def _timed_windows(program, compiled, warmup_steps, per_window, windows_, profile_dir=None):
  """Each window's seconds per step, and the last loss; a traced window after them with
  `profile_dir`."""
  run, rng = compiled.executable, program.rng
  live = dict(zip(('state', 'batch'), program.materialize(compiled.n)))

  def step():
    live['state'], metrics = run(live['state'], live['batch'], rng)
    return metrics

  try:
    with jax.transfer_guard('disallow'):
      times, metrics, _ = windows(step, jax.block_until_ready, warmup_steps, per_window, windows_)
      if profile_dir:
        with jax.profiler.trace(profile_dir):
          _, metrics, _ = windows(step, jax.block_until_ready, 0, per_window, 1)
    loss = float(np.asarray(metrics['loss']))
  finally:
    live.clear()  # the state and batch go before the caller reads the memory statistics
  return times, loss
