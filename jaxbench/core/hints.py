"""Predicted peaks from earlier results, to aim a new search (--search_hints=FILE).

XLA's compile-time memory forecast depends on the program, not on the memory budget: the same
workload, precision, configuration, software and XLA flags on the same kind of device predict
the same peak at the same batch (seen on the H200: BERT-base at 1 and 137 sequences forecast the
same bytes under a 24 GB cap as at full memory). So the trials of earlier searches (at another
memory size, a sweep's other cards, a run that was interrupted) say where a new search's
boundary lies before it compiles anything. The search still compiles, and runs, both sides of
the boundary itself: hints change how many probes it takes, never its answer.

With --search_resume the trials of earlier runs of the same program under the same memory
also decide (decided(), below): a search whose compiles take minutes each can then go on in a
new process where an earlier one was stopped, each trial keeping the time of the run that made
it, and the reported batch is compiled and run again before it is timed.

A forecast is a fact about the compiled program, not about the memory it ran under, so a
compile-only prediction (--predict --search_resume) takes every earlier forecast of the same
program compiled the same way (forecasts(), below) as known, at any card's cap: on an H200, each
of 21 batches compiled a second time, in another process, under another cap or beside other
compile jobs, forecast the same bytes (bert_base, deeplabv3, nasnet_large, mask_rcnn, pix2pixhd,
yolov3). The exception to expect: a compile whose autotuner is refused the buffers it asks for
(12-32 GiB at full-memory image batches, under a 35.7 GB share of the GPU) may pick other
algorithms, with other workspaces.
"""

import dataclasses
import json
import re
import sys
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from jaxbench.results import records, store

if TYPE_CHECKING:  # probe imports JAX; the report reads hints without it
  from jaxbench.core import probe

# What must agree for a recorded forecast to hold: the program (workload and its revision,
# precision, preset, configuration), the compiler (JAX version, XLA flags, remat included)
# and the device kind.
_SAME = ('workload', 'precision', 'tiny', 'jax_version')


# XLA flags that say where caches and logs live: they change how long a compile takes or what it
# writes beside it, not its program.
_CACHE_FLAG = re.compile(r'^--xla_gpu_(per_fusion_autotune_cache_dir|dump_autotune_logs_to)=')


def compiler_flags(xla_flags: str | None) -> str:
  """The XLA flags that decide the compiled program: `xla_flags` without cache and log paths."""
  return ' '.join(f for f in (xla_flags or '').split() if not _CACHE_FLAG.match(f))


def program_key(r: dict[str, Any], any_jax: bool = False) -> str:
  """What decides a result's compile-time forecasts, as one comparable string: its program and
  compiler (_SAME, the workload revision, the configuration, the XLA flags without cache
  locations, the PRNG implementation) and its device kind. The memory cap is not in it; nor,
  with `any_jax`, the JAX version."""
  fields = {k: r.get(k) for k in _SAME if not (any_jax and k == 'jax_version')}
  fields['revision'] = store.revision(r)
  fields['xla_flags'] = compiler_flags(r.get('xla_flags'))
  fields['prng_impl'] = records.prng_impl(r)  # another PRNG's draws, another step
  fields['config'] = r.get('config')
  fields['kind'] = (r.get('device') or {}).get('kind')
  par = r.get('parallel') or {}  # a data-parallel step is another program (its collectives)
  if par.get('global_devices', 1) > 1 or par.get('shard_optimizer'):
    fields['parallel'] = [par.get('global_devices'), bool(par.get('shard_optimizer'))]
  return json.dumps(fields, sort_keys=True, default=str)


_reported: set[str] = set()  # the warnings already printed: a run reads its hints several times


def _same_program(
  paths: Iterable[str], head: dict[str, Any], any_jax: bool = False
) -> Iterator[dict[str, Any]]:
  """The records in `paths`, in order, of the program `head` compiles (program_key; with
  `any_jax`, under any JAX version). A line that is not a result is reported once on stderr and
  skipped (store.read)."""
  want = program_key(head, any_jax)
  for path in paths:
    found, warning = store.read(path)
    if warning and warning not in _reported:
      _reported.add(warning)
      print(warning, file=sys.stderr, flush=True)
    yield from (r for r in found if program_key(r, any_jax) == want)


def load(paths: Iterable[str], head: dict[str, Any]) -> tuple[dict[int, int], int, list[str]]:
  """n -> predicted peak bytes from the matching results in `paths`, how many matched, and the
  JAX versions they were compiled by where that is not this run's (else []).

  `head` is this run's run_record.identity(...). Later records win where two give the same n.
  Where no result of this JAX version matches, those of the same program under other versions
  aim the search: another compiler's forecast is near this one's, not equal to it, and a hint
  only aims a probe, which compiles; decided() and forecasts(), which stand in for compiles,
  take this version's only. Compile-only predictions made on a CPU with another JAX than the
  GPU's so still aim a search on that GPU.
  """
  for any_jax in (False, True):
    peaks: dict[int, int] = {}
    matched, versions = 0, set()
    for r in _same_program(paths, head, any_jax):
      matched += 1
      versions.add(str(r.get('jax_version')))
      for t in (r.get('search') or {}).get('trials') or []:
        if t.get('predicted_peak_bytes'):
          peaks[int(t['examples'])] = int(t['predicted_peak_bytes'])
    if matched:
      return peaks, matched, sorted(versions) if any_jax else []
  return {}, 0, []


def summary(
  paths: Iterable[str], matched: int, peaks: dict[int, int], other_jax: list[str]
) -> dict[str, Any]:
  """A search record's `hints`: the files read, the results and points that aimed it, and the
  JAX versions of those results where they are not the run's own."""
  out: dict[str, Any] = {'files': list(paths), 'results': matched, 'points': len(peaks)}
  if other_jax:
    out['jax_versions'] = other_jax
  return out


def _memory(r: dict[str, Any]) -> tuple[Any, Any]:
  return (r.get('memory') or {}).get('limit_bytes'), (r.get('device') or {}).get('pool_bytes')


def decided(paths: Iterable[str], head: dict[str, Any], budget: int | None) -> list['probe.Trial']:
  """The decided trials (fits, out of memory) of earlier runs in `paths` that hold for this one.

  They hold where the program, compiler and device kind agree (program_key) and so does the
  memory: the same --memory_limit_gb and the same device pool. A forecast is judged again
  against this run's `budget`: a trial that fitted, or was predicted out of memory, by its
  forecast under a budget a few bytes apart is dropped where the verdict would now differ.
  Trials that stopped with an error or were cut in their run decide nothing, nor do those of a
  --predict (its fits never ran, and where compile-only jobs share a GPU, an out-of-memory
  compile may be the neighbours' doing). Each trial's
  `earlier` is its run's timestamp; where two runs disagree (the same batch, or a fit above a
  failure) the later run's trial wins and the earlier one is dropped, so what is returned is
  consistent: every fit below every failure.
  """
  from jaxbench.core import probe  # pylint: disable=g-import-not-at-top  (JAX: only where resumed)

  memory = _memory(head)
  timed: list[tuple[str, int, probe.Trial]] = []  # (its run's time, read order, trial)
  fields = {f.name for f in dataclasses.fields(probe.Trial)}
  for r in _same_program(paths, head):
    if _memory(r) != memory or (r.get('search') or {}).get('mode') == 'predict':
      continue  # another memory; or a compile-only search, which ran nothing
    for t in (r.get('search') or {}).get('trials') or []:
      if t.get('outcome') not in probe.DECIDED or t.get('autotune_level') is not None:
        continue  # undecided; or a probe of another program (find_max_batch_probing)
      trial = probe.Trial(**{k: v for k, v in t.items() if k in fields})
      trial.earlier = trial.earlier or r.get('timestamp')
      peak = trial.predicted_peak_bytes
      if budget is not None and peak is not None:
        if trial.outcome == probe.OOM_PREDICTED and peak <= budget:
          continue
        if trial.fits and peak > budget:
          continue
      timed.append((trial.earlier or '', len(timed), trial))
  found: dict[int, probe.Trial] = {}
  for _, _, trial in sorted(timed, key=lambda x: x[:2]):
    n = trial.examples
    for m, t in list(found.items()):
      if (trial.fits and not t.fits and m <= n) or (not trial.fits and t.fits and m >= n):
        del found[m]
    found[n] = trial
  return [found[n] for n in sorted(found)]


def forecasts(paths: Iterable[str], head: dict[str, Any]) -> dict[int, tuple[int, str | None]]:
  """n -> (predicted peak bytes, its run's timestamp) from every trial in `paths` that compiled
  the same program (program_key) the same way: on the device, or for the same target without
  one (device.deviceless), as `head` is. A forecast holds whatever memory its run had, so the
  memory cap is not compared; a step loaded from the compilation cache forecasts what its
  compile did. A --probe_autotune_level run's probes are another program's (autotuned at
  another level) and are left out. Later records win where two give the same n."""
  deviceless = bool((head.get('device') or {}).get('deviceless'))
  found: dict[int, tuple[int, str | None]] = {}
  for r in _same_program(paths, head):
    if bool((r.get('device') or {}).get('deviceless')) != deviceless:
      continue
    for t in (r.get('search') or {}).get('trials') or []:
      if t.get('predicted_peak_bytes') and t.get('autotune_level') is None:
        when = t.get('earlier') or r.get('timestamp')
        found[int(t['examples'])] = (int(t['predicted_peak_bytes']), when)
  return found


def forecast_trials(
  earlier: dict[int, tuple[int, str | None]], budget: int, example_size: int, max_examples: int
) -> list['probe.Trial']:
  """Earlier forecasts (n -> (peak, its run's time), forecasts()) as the trials a search under
  `budget` would decide by compiling those batches again: a fit by its forecast (not run) where
  the peak is within the budget, else predicted out of memory.

  Taken in increasing n up to the first one over the budget: a forecast that is not monotone in
  the batch (transformer_big's, near some batches) could otherwise put a fit above a failure,
  and the search's bracket needs every fit below every failure. Fits above max_examples are
  left to the cap.
  """
  from jaxbench.core import probe  # pylint: disable=g-import-not-at-top  (JAX: only where resumed)

  trials = []
  for n in sorted(earlier):
    peak, when = earlier[n]
    fits = peak <= budget
    if fits and n > max_examples:
      break
    trials.append(
      probe.Trial(
        examples=n,
        batch=n * example_size,
        outcome=probe.FITS if fits else probe.OOM_PREDICTED,
        predicted_peak_bytes=peak,
        detail='' if fits else f'predicted peak {peak / 1e9:.3f} GB > budget {budget / 1e9:.3f} GB',
        earlier=when,
      )
    )
    if not fits:
      break
  return trials


def combined(ran: list['probe.Trial'], by_forecast: list['probe.Trial']) -> list['probe.Trial']:
  """A resumed run's known trials: those that decided an earlier run under the same memory
  (decided()) and, where those say nothing, the earlier forecasts of any run judged against this
  run's budget (forecast_trials()). A forecast trial is dropped at a batch that also ran, and
  where it would contradict what ran (a fit by forecast at or above a batch that ran out of
  memory, a failure at or below one that ran), so the result keeps every fit below every
  failure."""
  taken = {t.examples for t in ran}
  fits = [t.examples for t in ran if t.fits]
  fails = [t.examples for t in ran if not t.fits]
  kept = [
    t
    for t in by_forecast
    if t.examples not in taken
    and not (t.fits and fails and t.examples >= min(fails))
    and not (not t.fits and fits and t.examples <= max(fits))
  ]
  return sorted(ran + kept, key=lambda t: t.examples)
