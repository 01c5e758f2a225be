"""The log's lines about a search: one per trial, the trials it resumed from, a probing check."""

from jaxbench.core import probe, probing
from jaxbench.results import records as report
from models import workload as wl


def trial_line(w: wl.Workload, t: probe.Trial) -> str:
  peak = (
    '' if t.predicted_peak_bytes is None else f' peak {report.human_bytes(t.predicted_peak_bytes)}'
  )
  comp = '' if t.compile_s is None else f' compile {t.compile_s:.1f}s'
  why = f' ({t.detail})' if t.detail and not t.fits else ''
  level = '' if t.autotune_level is None else f' [autotune level {t.autotune_level}]'
  return f'  {w.name}: batch {t.batch} {w.unit}: {t.outcome}{peak}{comp}{level}{why}'


def probe_check_text(check: probing.ProbeCheck) -> str:
  """The probe check in a few words, for the run's log: both forecasts where they differ."""
  if check.equal:
    return 'the same bytes'

  def shown(b: int | None) -> str:
    return 'no forecast' if b is None else f'{b:,} B'

  return (
    f"other bytes ({shown(check.peak_bytes)} against the probe's "
    f'{shown(check.probe_peak_bytes)}): the search went on autotuned'
  )


def trials_text(w: wl.Workload, trials: list[probe.Trial]) -> str:
  """'359 fits, 361 oom_predicted (earlier run 2026-12-01T04:52:30+00:00)'."""
  parts = [f'{t.batch} {t.outcome}' for t in sorted(trials, key=lambda t: t.examples)]
  runs = sorted({t.earlier for t in trials if t.earlier})
  return ', '.join(parts) + (f' ({w.unit}; earlier runs {", ".join(runs)})' if runs else '')
