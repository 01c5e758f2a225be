"""Deviceless forecasts against the GPU's own, at the same batch: how far --compile_for is off.

Every search trial holds XLA's compile-time peak forecast at one batch. A deviceless trial
(compiled for the GPU on a host without one: no autotuning) and a trial compiled on the GPU
itself match when they are the same program (hints.program_key: workload and revision,
precision, preset, configuration, JAX version, XLA flags and device kind), at the same batch. The
memory cap does not change the program (jaxbench/hints.py), so the trials of any search match,
interrupted ones included.
"""

import dataclasses
import json
from typing import Any, Iterable

from jaxbench.core import hints


@dataclasses.dataclass(frozen=True)
class Gap:
  """One batch compiled both ways."""

  workload: str
  precision: str
  examples: int
  on_device: int  # predicted peak bytes, compiled on the GPU
  deviceless: int  # predicted peak bytes, compiled for it without one

  @property
  def name(self) -> str:
    return f'{self.workload} {self.precision}'

  @property
  def relative(self) -> float:
    return (self.deviceless - self.on_device) / self.on_device


def _peaks(records: Iterable[dict[str, Any]], deviceless: bool) -> dict[tuple[str, int], int]:
  """(identity, examples) -> predicted peak bytes over the trials of the matching records."""
  out = {}
  for r in records:
    if bool((r.get('device') or {}).get('deviceless')) != deviceless:
      continue
    for t in (r.get('search') or {}).get('trials') or []:
      if t.get('predicted_peak_bytes') and t.get('autotune_level') is None:  # not a probe's
        out[(hints.program_key(r), int(t['examples']))] = int(t['predicted_peak_bytes'])
  return out


def gaps(
  deviceless: Iterable[dict[str, Any]], on_device: Iterable[dict[str, Any]] | None = None
) -> list[Gap]:
  """Every batch compiled both ways, by workload, precision and batch.

  With one argument, the records of both kinds come mixed (a report's store)."""
  deviceless = list(deviceless)
  on_device = deviceless if on_device is None else list(on_device)
  less, dev = _peaks(deviceless, True), _peaks(on_device, False)
  out = []
  for key in set(less) & set(dev):
    ident = json.loads(key[0])
    out.append(Gap(ident['workload'], ident['precision'], key[1], dev[key], less[key]))
  return sorted(out, key=lambda g: (g.workload, g.precision, g.examples))


def largest(found: list[Gap]) -> dict[str, Gap]:
  """Per workload and precision, the batch with the largest gap either way."""
  worst: dict[str, Gap] = {}
  for g in found:
    if g.name not in worst or abs(g.relative) > abs(worst[g.name].relative):
      worst[g.name] = g
  return worst
