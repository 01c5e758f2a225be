"""--predict: each card's max batch from XLA's compile-time memory analysis, nothing run.

The compile-only search is search.find_max_batch with run_steps=0 and the card's cap
(card memory - overhead, see catalog) as the budget: a batch fits when its predicted peak is
within the cap. One workload's compiles are shared by all cards (a memo keyed by the batch),
so predicting eight cards costs little more than predicting the largest. The prediction is
for the backend it compiles on: run it on a GPU to predict GPUs (XLA:CPU plans memory
differently).

With --search_resume the forecasts of earlier compiles of the same program, compiled the same
way (hints.forecasts), are known without compiling: each card's search starts from them and
compiles only what they leave open, so a prediction cut at a deadline goes on where it stopped,
and the batches an earlier search compiled near a card's cap (a 24 GB run's boundary) cost
nothing.
"""

import dataclasses
import functools
import time
from typing import Any, Callable, Iterator

from jaxbench.cards import catalog, deviceless, emulation
from jaxbench.core import bench, hints, interrupt, mesh, probe, run_record, search, search_log
from jaxbench.core import program as prog
from jaxbench.results import store
from models import precision
from models import workload as wl


class PeakMemo:
  """A Program whose compile is memoized by batch, executables dropped: peaks are all we need.
  Each compile's leftovers in the host's memory go with it (program.release_host)."""

  def __init__(self, program: prog.Program):
    self.program, self.workload, self.cfg = program, program.workload, program.cfg
    self._peaks: dict[int, prog.Compiled | Exception] = {}
    self.compiles = 0

  def compile(self, n: int) -> prog.Compiled:
    if n not in self._peaks:
      self.compiles += 1
      try:
        self._peaks[n] = dataclasses.replace(self.program.compile(n), executable=None)
      except Exception as e:  # pylint: disable=broad-except
        self._peaks[n] = RuntimeError(prog.first_line(e))  # no traceback: it pins buffers
      prog.release_host()  # out of the except clause, where nothing holds the error any more
      fresh = self._peaks[n]
      if isinstance(fresh, Exception):
        raise fresh
      return fresh
    hit = self._peaks[n]
    if isinstance(hit, Exception):
      raise hit
    return dataclasses.replace(hit, compile_s=0.0)  # reused: no compile time spent

  def run(self, compiled: prog.Compiled, steps: int) -> float:
    raise RuntimeError('a compile-only search runs nothing')


def predict(
  w: wl.Workload,
  opts: bench.Options,
  gpus: list[catalog.Gpu],
  remat: bool = False,
  log: Callable[[str], None] = print,
  target: Any = None,
  checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> Iterator[dict[str, Any]]:
  """One result per card, smallest card first, as each is found: the max batch under its cap.

  Each probe is logged as it ends. `checkpoint` (--progress_file) is given the record of the
  card being searched after each probe, status 'interrupted' and its trials so far: what a
  prediction killed in a long compile had found (its forecasts still aim and, resumed, decide).
  Interrupted (SIGINT), it raises bench.Interrupted with that record.

  `target`: compile for this described GPU instead of the local device (jaxbench.cards.deviceless).
  """
  policy = precision.get(opts.precision or w.default_precision)
  cfg = w.resolve(tiny=opts.tiny, overrides=dict(opts.overrides))
  # On the device, the program a run compiles (a mesh of one device): one compilation cache entry.
  layout = None if target is not None else mesh.Layout.local(1)
  program = prog.Program(w, cfg, policy, seed=opts.seed, target=target, layout=layout)
  memo = PeakMemo(program)
  dev = run_record.device_info() if target is None else deviceless.device_info(target)
  header = {
    **run_record.identity(w, cfg, policy, opts.tiny, dev),
    'params': program.param_counts(),
  }
  peaks, matched, other_jax = hints.load(opts.search_hints, header)
  earlier = hints.forecasts(opts.search_hints, header) if opts.search_resume else {}

  def record(card: _Card, found: search.Result | None) -> dict[str, Any]:
    """The card's result: of its finished search `found`, or (None) of its search so far."""
    gpu, known = card.gpu, card.known
    done = card.trials if found is None else found.trials
    largest = 0 if found is None else found.max_examples
    fits = [t for t in done if found is not None and t.fits and t.examples == largest]
    result = {
      **header,
      'timestamp': run_record.now(),
      'memory': {
        'limit_bytes': gpu.cap_bytes,
        'budget_bytes': gpu.cap_bytes,
        'enforced_by': 'compile-time prediction'
        + (f' for {dev["kind"]}, compiled without it' if target is not None else ''),
        'remat': remat,
      },
      'search': {
        'mode': 'predict',
        'hints': hints.summary(opts.search_hints, matched, peaks, other_jax),
        'trials': [dataclasses.asdict(t) for t in done],
        'seconds': None if found is None else round(time.perf_counter() - card.start, 2),
        'compiles': memo.compiles - card.compiles,
        'capped': False if found is None else found.capped,
        **(
          {'resumed': {'trials': len(known), 'runs': sorted({t.earlier for t in known})}}
          if opts.search_resume
          else {}
        ),
      },
      'max_examples': largest,
      'max_batch': largest * w.example_size(cfg),
      'predicted_peak_bytes': fits[0].predicted_peak_bytes if fits else None,
      'measurement': None,
    }
    if found is None:
      result.update(
        status='interrupted',
        error=f'ended without its result, while predicting for the {gpu.display}',
      )
    elif found.error is not None:
      result.update(status='error', error=found.error)
    elif found.max_examples == 0:
      result.update(status='oom', error='not even one example is predicted to fit')
    else:
      result.update(status='ok', error=None)
    return emulation.annotate(result, gpu, opts.overrides, mode='predict')

  def on_trial(card: _Card, t: probe.Trial) -> None:
    card.trials.append(t)
    if checkpoint is not None:  # first: a log that shows a probe has it in the checkpoint
      checkpoint(record(card, None))
    if t.compile_s != 0.0:  # a probe of this search, not a batch an earlier card compiled
      log(f'{search_log.trial_line(w, t)} (for the {card.gpu.display})')

  for gpu in sorted(gpus, key=lambda g: g.cap_bytes):
    known = hints.forecast_trials(earlier, gpu.cap_bytes, w.example_size(cfg), opts.max_examples)
    card = _Card(gpu, known, time.perf_counter(), memo.compiles, list(known))
    try:
      found = search.find_max_batch(
        memo,
        gpu.cap_bytes,
        opts.max_examples,
        run_steps=0,
        on_trial=functools.partial(on_trial, card),
        tolerance=opts.search_tolerance,
        hints=peaks,
        known=known,
      )
    except KeyboardInterrupt:
      interrupt.taken()
      raise bench.Interrupted(record(card, None)) from None
    result = record(card, found)
    log(line(result))
    yield result


@dataclasses.dataclass
class _Card:
  """One card's search in a prediction: what it started from and its trials so far."""

  gpu: catalog.Gpu
  known: list[probe.Trial]  # earlier forecasts, decided without compiling (--search_resume)
  start: float  # time.perf_counter() at its start
  compiles: int  # the memo's compiles before it
  trials: list[probe.Trial]


def line(r: dict[str, Any]) -> str:
  """One line per prediction, for the console."""
  emu = r['emulation']
  what = (
    'OOM'
    if r['status'] == 'oom'
    else f"{r['max_batch']} {r['unit']}"
    if r['status'] == 'ok'
    else f"{r['status']}: {r['error']}"
  )
  peak = r.get('predicted_peak_bytes')
  cap = emu['cap_bytes'] / 1e9
  return (
    f"  {r['workload']} {r['precision']} on {emu['gpu']} (cap {cap:.2f} GB):"
    f" predicted max batch {what}"
    f"{' (at least: the search stopped at --max_examples)' if store.lower_bound(r) else ''}"
    f"{'' if peak is None else f', peak {peak / 1e9:.3f} GB'}"
    f" ({len(r['search']['trials'])} probes, {r['search']['compiles']} compiles)"
  )
