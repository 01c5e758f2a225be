"""The max-batch search run again on a recorded search's forecasts, compiling nothing.

A result records each probe of its search with XLA's forecast (predicted peak and temporaries)
and its outcome. Replayed, today's search (search.find_max_batch) probes a program whose forecast
at any batch is the line through the recorded forecasts on either side of it, whose runs fail
from the smallest batch that failed when run, and which compiles nothing: so a change to how the
search aims can be weighed against every search on record, in compiles and in the maximum found,
before a GPU runs it (python -m jaxbench.search_replay). Between recorded batches the forecast is
an interpolation, not XLA's: where the replay probes a batch the recorded search did not, its
outcome is the line's guess, and the replay of the same rule can differ from the record.
"""

import bisect
import dataclasses
from typing import Any

from jaxbench.core import program as prog
from jaxbench.core import search
from jaxbench.core.probe import OOM_RUN
from jaxbench.results import store
from models import registry


@dataclasses.dataclass(frozen=True)
class Replayed:
  """One recorded search and its replay: how many compiles each took and the maximum each
  found, in examples (sentence pairs for the token workloads)."""

  workload: str
  precision: str
  device: str
  budget_bytes: int
  tolerance: float
  recorded_compiles: int
  recorded_max: int
  compiles: int
  max_examples: int
  error: str | None


class RecordedProgram:
  """A search's program as its record saw it (the search.find_max_batch interface)."""

  def __init__(self, workload, cfg, forecasts: dict[int, tuple[int, int]], fails_from: int | None):
    self.workload, self.cfg = workload, cfg
    self._points = sorted(forecasts.items())  # n -> (predicted peak, predicted temporaries)
    self._fails_from = fails_from  # the smallest batch whose run was out of memory
    self.compiled: list[int] = []

  def forecast(self, n: int) -> tuple[int, int]:
    """The predicted peak and temporaries at n: recorded, or on the line through the recorded
    batches on either side (the two nearest at either end)."""
    xs = [x for x, _ in self._points]
    i = bisect.bisect_left(xs, n)
    if i < len(xs) and xs[i] == n:
      return self._points[i][1]
    i = min(max(i, 1), len(xs) - 1)
    (a, (pa, ta)), (b, (pb, tb)) = self._points[i - 1], self._points[i]
    return round(pa + (pb - pa) * (n - a) / (b - a)), round(ta + (tb - ta) * (n - a) / (b - a))

  def compile(self, n: int) -> prog.Compiled:
    self.compiled.append(n)
    peak, temp = self.forecast(n)
    return prog.Compiled(n, None, 0.0, peak, temp, peak - temp)

  def run(self, compiled: prog.Compiled, steps: int) -> float:
    del steps
    if self._fails_from is not None and compiled.n >= self._fails_from:
      raise RuntimeError('RESOURCE_EXHAUSTED: out of memory when it ran (as recorded)')
    return 0.0

  def device_memory(self) -> None:
    return None  # no device: nothing in use to report (probe._device_memory)


def _trials(record: dict[str, Any]) -> list[dict[str, Any]]:
  """The probes a search of this run compiled itself (not earlier runs')."""
  return [t for t in (record.get('search') or {}).get('trials') or [] if not t.get('earlier')]


def replayable(record: dict[str, Any]) -> bool:
  """Whether a result holds a whole JAX search to replay: a max-batch search under a memory
  budget, not aimed by earlier results, that ended on its own, with forecasts at two batches at
  least."""
  s = record.get('search') or {}
  forecasts = {t['examples'] for t in _trials(record) if t.get('predicted_temp_bytes') is not None}
  return (
    record.get('framework', 'jax') == 'jax'
    and s.get('mode') == 'search'
    and record.get('status') == 'ok'
    and not (s.get('hints') or {}).get('points')
    and bool((record.get('memory') or {}).get('budget_bytes'))
    and len(forecasts) >= 2
    and record.get('workload') in registry.names()
  )


def replay(record: dict[str, Any], tolerance: float | None = None) -> Replayed:
  """Today's search on a recorded search's forecasts (replayable), at the record's tolerance or
  at `tolerance`."""
  trials = _trials(record)
  forecasts = {
    t['examples']: (t['predicted_peak_bytes'], t['predicted_temp_bytes'])
    for t in trials
    if t.get('predicted_temp_bytes') is not None
  }
  fails = [t['examples'] for t in trials if t.get('outcome') == OOM_RUN]
  w = registry.get(record['workload'])
  program = RecordedProgram(w, record.get('config') or {}, forecasts, min(fails, default=None))
  budget = record['memory']['budget_bytes']
  s = record['search']
  tol = (s.get('tolerance') or 0.0) if tolerance is None else tolerance
  result = search.find_max_batch(program, budget, run_steps=1, tolerance=tol)
  return Replayed(
    workload=record['workload'],
    precision=record['precision'],
    device=(record.get('device') or {}).get('kind') or '',
    budget_bytes=budget,
    tolerance=tol,
    recorded_compiles=s.get('compiles', len(trials)),
    recorded_max=record.get('max_examples') or 0,
    compiles=len(program.compiled),
    max_examples=result.max_examples,
    error=result.error,
  )


def replay_stores(paths: list[str], tolerance: float | None = None) -> list[Replayed]:
  """Every replayable search in the stores, in order, replayed."""
  return [replay(r, tolerance) for p in paths for r in store.read(p)[0] if replayable(r)]
