"""Data-parallel scaling efficiency: one device timed at the per-device batch of a run on N."""

from typing import Any

import jax

from jaxbench.core import mesh, timing
from jaxbench.core import program as prog


def measure(w, cfg, policy, opts, n: int, units_per_s: float, devices: int) -> dict[str, Any]:
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
