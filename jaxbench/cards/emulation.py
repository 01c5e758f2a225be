"""--gpu, --memory_gb, --gpus, --predict and --store: which cards, and what kind of run.

Checked before the JAX backend starts (this module imports no JAX and no model): the card
decides the memory cap that jaxbench.core.backend must set first.
"""

import dataclasses
import os
from typing import Any

from jaxbench import cli
from jaxbench.cards import catalog, deviceless

SINGLE, PREDICT, SWEEP = 'single', 'predict', 'sweep'


@dataclasses.dataclass(frozen=True)
class Request:
  """What the flags ask for: a kind of run and the cards it concerns."""

  kind: str  # SINGLE (one run, maybe emulated), PREDICT (compile only) or SWEEP (subprocesses)
  gpus: tuple[catalog.Gpu, ...] = ()  # empty: a plain run on the device as it is
  target: str | None = None  # PREDICT only: compile for this GPU without one (--compile_for)

  @property
  def limit_gb(self) -> float | None:
    """The memory cap for backend.configure (GB, 1e9 bytes), or None."""
    if self.kind != SINGLE or not self.gpus:
      return None
    return self.gpus[0].cap_bytes / 1e9


def request(a: cli.Args) -> Request:
  """Check the card, prediction and sweep values of the command line; what kind of run it is."""
  given = [
    n
    for n, v in (
      ('--gpu', a.gpu),
      ('--memory_gb', a.memory_gb),
      ('--memory_limit_gb', a.memory_limit_gb),
      ('--gpus', a.gpus),
    )
    if v not in (None, ())
  ]
  if len(given) > 1:
    raise ValueError(f'{" and ".join(given)} conflict: each sets the memory; give one')
  gpus: list[catalog.Gpu] = []
  if a.gpu is not None:
    gpus = [catalog.get(a.gpu)]
  elif a.memory_gb is not None:
    gpus = [catalog.raw(a.memory_gb)]
  elif a.gpus:
    gpus = catalog.resolve(list(a.gpus))
  if a.compile_for is not None:
    deviceless.check(a.compile_for)
    if not a.predict or a.store is not None:
      raise ValueError('--compile_for only predicts: give --predict (and no --store)')
  if a.predict and a.probe_autotune_level is not None:  # a sweep's cells too
    raise ValueError(
      '--probe_autotune_level is for runs: --predict compiles only (give --autotune_level)'
    )
  if a.store is not None:
    if not gpus or a.memory_gb is not None:
      raise ValueError('a sweep (--store) needs catalog GPUs: --gpus=lambda2020 or a list')
    for name, bad in (
      ('--output', a.output),
      ('--precision', a.precision),
      ('--batch_size', a.batch_size is not None),
      ('--describe', a.describe),
      ('--progress_file', a.progress_file),
    ):
      if bad:
        raise ValueError(
          f'a sweep (--store) takes no {name}'
          + (' (use --precisions)' if name == '--precision' else '')
        )
    parent = os.path.dirname(os.path.abspath(a.store))
    if not os.path.isdir(parent) or os.path.isdir(a.store):
      raise ValueError(f'--store: {a.store} is not a file in an existing directory')
    return Request(SWEEP, tuple(gpus))
  if a.precisions and not a.frameworks:
    raise ValueError(
      '--precisions is for sweeps (--store) and --frameworks; a single run takes --precision'
    )
  if a.predict:
    if not gpus:
      raise ValueError('--predict needs the cards to predict for: --gpus, --gpu or --memory_gb')
    if a.batch_size is not None:
      raise ValueError('--predict searches the max batch: it takes no --batch_size')
    if not a.run_every_fit:
      raise ValueError('--norun_every_fit is for runs: --predict runs nothing')
    return Request(PREDICT, tuple(gpus), a.compile_for)
  if a.gpus:
    raise ValueError('--gpus runs many cards: give --store=FILE for a sweep, or --predict')
  return Request(SINGLE, tuple(gpus))


def annotate(
  result: dict[str, Any],
  gpu: catalog.Gpu | None,
  overrides: tuple[tuple[str, str], ...],
  mode: str = 'run',
) -> dict[str, Any]:
  """Record in a result what ran (run or predict), its overrides and the card it emulated."""
  result['mode'] = mode
  result['overrides'] = sorted([k, v] for k, v in overrides)
  if gpu is None:
    result['emulation'] = None
    return result
  emu = gpu.emulation()
  cap = f'{gpu.cap_bytes / 1e9:.3f} GB'
  where = (result.get('memory') or {}).get('enforced_by')
  if mode == 'predict' and (result.get('device') or {}).get('deviceless'):
    emu['how'] = (
      f"predicted: compile-time peak <= {cap} (card memory - overhead), compiled for "
      f"{result['device']['kind']} on a host without it (no autotuning), nothing run"
    )
  elif mode == 'predict':
    emu['how'] = f'predicted: compile-time peak <= {cap} (card memory - overhead), nothing run'
  elif where == 'allocator':
    allocator = 'PyTorch' if result.get('framework') == 'pytorch' else 'XLA'
    emu['how'] = f'emulated: {allocator} allocator capped at {cap} (card memory - overhead)'
  else:
    emu['how'] = f'emulated: compile-time predicted peak bounded by {cap} ({where})'
  result['emulation'] = emu
  return result
