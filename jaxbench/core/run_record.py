"""A run's result record: head (software, device, memory), search and timing, or how far it got."""

import dataclasses
import datetime
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

import jaxbench
from jaxbench.core import backend, environment, probe, search, timing
from jaxbench.core import program as prog
from jaxbench.core import progress as display
from models import precision
from models import workload as wl

if TYPE_CHECKING:  # bench builds its records here
  from jaxbench.core import bench

SCHEMA = 'jaxbench.result/1'
# Without a GPU the search has no device memory to fill; it uses this budget of
# compile-time predicted peak instead, so the command still ends in minutes.
CPU_DEFAULT_BUDGET_GB = 0.25


def device_info() -> dict[str, Any]:
  dev = jax.local_devices()[0]
  stats = prog.device_memory() or {}
  return {
    'platform': dev.platform,
    'kind': dev.device_kind,
    'count': jax.device_count(),
    'pool_bytes': stats.get('bytes_limit'),
  }


def on_gpu() -> bool:
  """Whether JAX runs on a GPU: without one --tiny defaults to on, so a CPU run ends in minutes."""
  return jax.devices()[0].platform == 'gpu'


def examples_for(w: wl.Workload, cfg: wl.Config, batch: int) -> int:
  """The examples of a batch given in the workload's unit: whole examples, cut to a batch the
  workload runs (fairseq's --max-tokens of 16,384 at 30 tokens a sentence: 546 sentences, cut
  to 544, a multiple of 8)."""
  n = batch // w.example_size(cfg)
  return n if n < w.batch_multiple else n - n % w.batch_multiple


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
    # Which PRNG draws the step's dropout and the synthetic batch (JAX_DEFAULT_PRNG_IMPL).
    'prng_impl': str(jax.config.jax_default_prng_impl),
    'workload': w.name,
    'workload_revision': w.revision,
    'unit': w.unit,
    'throughput_unit': w.throughput_unit,
    'precision': policy.name,
    'tiny': tiny,
    'config': dict(cfg),
  }


def searched(found: search.Result) -> dict[str, Any]:
  """The fields a finished search adds to the result's 'search'."""
  return dict(
    trials=[dataclasses.asdict(t) for t in found.trials],
    seconds=round(found.seconds, 2),
    # This run's compiles; steps loaded from the compilation cache are counted apart.
    compiles=sum(t.compile_s is not None and not t.earlier and not t.cached for t in found.trials),
    cache_loads=sum(t.cached and not t.earlier for t in found.trials),
    capped=found.capped,
  )


def search_ended(
  result: dict[str, Any], found: search.Result, size: int, opts: 'bench.Options'
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


def timed(
  w: wl.Workload, cfg: wl.Config, m: timing.Measurement, devices: int = 1
) -> dict[str, Any]:
  """What the timed steps give a result's 'measurement', in either framework: the batch, the
  windows and the throughputs on `devices`, the throughputs None where the loss was not finite
  (a diverged run measures nothing worth it)."""
  flops_per_step = w.flops_per_example(cfg) * m.examples * devices
  units_per_step = w.units_per_example(cfg) * m.examples * devices
  fields = {
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
    'process_peak_bytes': m.process_peak_bytes,
  }
  if not m.finite:
    for key in ('steps_per_s', 'units_per_s', 'tflops_per_s'):
      fields[key] = None
  return fields


def measurement(
  w: wl.Workload, cfg: wl.Config, m: timing.Measurement, best: prog.Compiled, devices: int
) -> dict[str, Any]:
  """The result's 'measurement' of a JAX run: the timed steps at the compiled step `best` on
  `devices`, with that program's forecast and compile."""
  return {
    **timed(w, cfg, m, devices),
    'predicted_peak_bytes': best.peak_bytes,
    'compile_s': best.compile_s,
    'compile_cached': best.cached,  # compile_s was a load from the compilation cache
    'profile_dir': m.profile_dir,
    'profile': m.profile,  # the traced window's GPU time per step, with --profile_dir
  }


@dataclasses.dataclass
class Progress:
  """How far a run got, for the result of an interrupted one."""

  phase: str = 'building the model'
  trials: list[probe.Trial] = dataclasses.field(default_factory=list)
  running: probe.Trial | None = None  # the probe being run: compiled, its forecast known
  changed: Callable[[], None] = lambda: None  # after each trial and change of phase
  line: display.Line | None = None  # what the live line shows (progress.py)

  def set_phase(self, phase: str, shown: str | None = None) -> None:
    """The phase an interrupted result names, and the live line's (`shown`, if other)."""
    self.phase = phase
    if self.line is not None:
      self.line.set_phase(shown or phase)

  def add(self, t: probe.Trial) -> None:
    self.trials.append(t)
    if self.line is not None and t.outcome != probe.UNFINISHED:
      self.line.trial(t.batch, t.fits)


def so_far(w, cfg, opts, result, progress: Progress, error: str) -> dict[str, Any]:
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
