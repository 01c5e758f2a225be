"""Measured runs as two tables: the max batch and throughput of each workload, precision and
memory, then every other measured run (fixed batches, other choices, earlier forms), each row with
the command that reproduces it and, where today's workload runs another program, what the
recorded one had."""

import json
from typing import Any, Iterable

from jaxbench.cards import catalog
from jaxbench.results import commands, published, records, store, tables

FULL = 'full'
TITLE = 'Max batch and throughput: one row per workload, precision and memory'
OTHER_TITLE = 'Other measured runs: fixed batches, other choices, earlier forms'
PRECISIONS = ('fp32', 'tf32', 'bf16', 'fp16')
HEADER = [
  'workload',
  'precision',
  'memory',
  'max batch',
  'throughput',
  'step ms',
  'TFLOP/s',
  'date',
  'JAX',
  'form',
  'command',
]
NOTES = [
  'memory: "full" is the allocator\'s pool, 95% of the GPU; "N GB" is --memory_limit_gb=N, the '
  'pool capped on the same GPU; a card\'s name is that card emulated (--gpu: the pool capped at '
  'its memory less what the driver and CUDA context take): its max batch is the card\'s, its '
  'throughput the measuring GPU\'s at that batch.',
  'max batch: the largest batch that fits, in the workload\'s unit (tokens = max_tokens for '
  'translation), exact unless the search stopped within a tolerance of more than one example '
  '(--search_tolerance); '
  '"fixed N": a batch given with --batch_size, no search; "≥N": every batch up to '
  '--max_examples fitted.',
  'step ms: the median of the timed windows\' mean step, ± half the spread between the fastest '
  'and the slowest window; TFLOP/s: the workload\'s counted training FLOPs per step over that '
  'median.',
  'form: empty where the command runs the recorded program today; "earlier form" names what the '
  'recorded program had that today\'s workload does not (its revision, config keys or values), '
  'which the command ran as of that revision.',
]
# Shown only where the runs span more than one GPU (the column with it).
GPU_NOTE = (
  'GPU: the GPU that measured the row, its device kind as the driver names it (shown where the '
  'runs span more than one); "full" and "N GB" are of its memory.'
)
# Shown only below a table with data-parallel runs.
PARALLEL_NOTE = (
  'data-parallel runs (--devices): "N per device × D devices" is the max batch of each of D '
  'devices, the throughput theirs together, and "(E% scaling)" its ratio to D times one device\'s '
  'at the same per-device batch (--scaling).'
)


def is_measured(r: dict[str, Any]) -> bool:
  """A completed run that timed steps: not a prediction, not a failure, not a search cut short."""
  return (
    r.get('mode', 'run') == 'run'
    and r.get('status') == 'ok'
    and not (r.get('device') or {}).get('deviceless')
    and (r.get('measurement') or {}).get('units_per_s') is not None
  )


def memory_of(r: dict[str, Any]) -> str:
  """Where the run's memory came from: the full pool, a --memory_limit_gb cap, or a card."""
  gpu = (r.get('emulation') or {}).get('gpu')
  if gpu:
    return tables.display(gpu)
  limit = (r.get('memory') or {}).get('limit_bytes')
  return FULL if not limit else f'{limit / 1e9:g} GB'


def gpu_of(r: dict[str, Any]) -> str:
  """The GPU that measured the run, as its device kind names it ('H200', 'H100 80GB HBM3')."""
  return ((r.get('device') or {}).get('kind') or '').removeprefix('NVIDIA ')


def _gpu_order(r: dict[str, Any]) -> tuple:
  """GPUs in the catalog's order (jaxbench/data/gpus.csv), then any other by name."""
  cards, name = catalog.names(), catalog.of_device((r.get('device') or {}).get('kind') or '')
  return (0, cards.index(name), '') if name in cards else (1, 0, gpu_of(r))


def is_fixed(r: dict[str, Any]) -> bool:
  """Whether the run timed a --batch_size it was given, not a searched max batch."""
  return (r.get('search') or {}).get('mode') == 'fixed'


def _key(r: dict[str, Any]) -> tuple:
  """A row: the GPU, the program (workload, revision, precision, preset, configuration, compiler
  and PRNG settings), the memory and the batch (a search's, or a fixed one); a later result of
  the same row replaces it."""
  return (
    gpu_of(r),
    r['workload'],
    store.revision(r),
    r['precision'],
    bool(r.get('tiny')),
    json.dumps(r.get('config'), sort_keys=True, default=str),
    records.compiler(r),
    memory_of(r),
    r['max_batch'] if is_fixed(r) else None,
    devices_of(r),
  )


def order(r: dict[str, Any]) -> tuple:
  """Where a result's row goes: the 2020 workload order, precision, GPU, memory (full, caps from
  the largest, then cards in catalog order), search before fixed batches (largest first), then
  date."""
  workloads, cards = published.workloads(), catalog.names()
  w, p, gpu = r['workload'], r['precision'], (r.get('emulation') or {}).get('gpu')
  limit = (r.get('memory') or {}).get('limit_bytes') or 0
  return (
    workloads.index(w) if w in workloads else len(workloads),
    w,
    PRECISIONS.index(p) if p in PRECISIONS else len(PRECISIONS),
    p,
    _gpu_order(r),
    (2, cards.index(gpu) if gpu in cards else len(cards)) if gpu else (bool(limit), -limit),
    is_fixed(r),
    -r['max_batch'],
    r.get('timestamp', ''),
  )


def latest(results: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
  """The last measured JAX result of each row, in the table's order (order())."""
  rows: dict[tuple, dict[str, Any]] = {}
  for r in results:
    if is_measured(r) and records.framework(r) == 'jax':  # PyTorch's: side_by_side.py
      rows[_key(r)] = r
  return sorted(rows.values(), key=order)


def figure(value: float) -> str:
  """A throughput with the digits that matter: 287,537, 2,763.9, 11.5 or 1.84."""
  if value >= 10000:
    return f'{value:,.0f}'
  return f'{value:,.1f}' if value >= 10 else f'{value:.2f}'


def devices_of(r: dict[str, Any]) -> int:
  """The devices the run trained on (all hosts'), 1 without --devices."""
  return (r.get('parallel') or {}).get('global_devices', 1)


def _batch(r: dict[str, Any]) -> str:
  unit = r['unit'][:-1] if r['max_batch'] == 1 and r['unit'].endswith('s') else r['unit']
  n = f'{r["max_batch"]:,} {unit}'
  if devices_of(r) > 1:
    n += f' per device × {devices_of(r)} devices'
  if is_fixed(r):
    return f'fixed {n}'
  if store.lower_bound(r):
    return f'≥{n}'
  tolerance = (r.get('search') or {}).get('tolerance') or 0.0
  # Exact where the tolerance is under one example (search.find_max_batch stops one apart).
  inexact = int(tolerance * r.get('max_examples', r['max_batch'])) >= 1
  return f'{n} (within {100 * tolerance:g}%)' if inexact else n


def _scaling(r: dict[str, Any]) -> str:
  eff = ((r.get('parallel') or {}).get('scaling') or {}).get('efficiency')
  return '' if eff is None else f' ({eff:.0%} scaling)'


def row(r: dict[str, Any], gpu: bool = False) -> list[str]:
  """A table row; with `gpu`, the GPU's column after the precision."""
  m = r['measurement']
  step, spread, tflops = m.get('median_step_s'), m.get('spread_pct'), m.get('tflops_per_s')
  step_ms = '' if step is None else f'{1e3 * step:,.1f}'
  if step_ms and spread is not None:
    step_ms += f' (±{spread / 2:.1f}%)'
  return [
    r['workload'],
    r['precision'] + (' tiny' if r.get('tiny') else ''),
    *[gpu_of(r)] * gpu,
    memory_of(r),
    _batch(r),
    f'{figure(m["units_per_s"])} {r["throughput_unit"]}' + _scaling(r),
    step_ms,
    '' if tflops is None else f'{tflops:.1f}',
    (r.get('timestamp') or '')[:10],
    r.get('jax_version') or '',
    commands.earlier_form(r) or '',
    commands.command_of(r),
  ]


def _rank(r: dict[str, Any]) -> tuple:
  """Which run speaks for its workload, precision and memory: a search before a fixed batch (which
  speaks only where no search ran), then today's program, its default configuration (a --set
  that names a default value changes nothing) or, among earlier forms, the latest revision and
  the configuration nearest today's default, jaxbench's default compiler settings (XLA's own
  autotuning, no Triton GEMMs, no XLA flags or PRNG of the run's own), and the latest."""
  return (
    not is_fixed(r),
    commands.earlier_form(r) is None,
    commands.default_config(r),
    store.revision(r),
    -commands.keys_off_default(r),
    not records.compiler(r),
    r.get('timestamp', ''),
  )


def split(results: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
  """The latest rows (latest()) parted in two, each in the table order: for each GPU, workload,
  precision, preset and memory the run that speaks for it (_rank), and every other run."""
  rows = latest(results)
  best: dict[tuple, dict[str, Any]] = {}
  for r in rows:
    key = (
      gpu_of(r),
      r['workload'],
      r['precision'],
      bool(r.get('tiny')),
      memory_of(r),
      devices_of(r),
    )
    if key not in best or _rank(r) > _rank(best[key]):
      best[key] = r
  chosen = {id(r) for r in best.values()}
  return [r for r in rows if id(r) in chosen], [r for r in rows if id(r) not in chosen]


def _table(title: str, chosen: list[dict[str, Any]], notes: list[str], gpu: bool) -> tables.Table:
  header = HEADER[:2] + ['GPU'] * gpu + HEADER[2:]
  notes = notes + [GPU_NOTE] * gpu + [PARALLEL_NOTE] * any(devices_of(r) > 1 for r in chosen)
  return tables.Table(title, header, [row(r, gpu) for r in chosen], notes, code=('command',))


def _split(results: Iterable[dict[str, Any]]) -> tuple[list, list, bool]:
  """split()'s two lists, and whether their runs name more than one GPU ('': none named)."""
  chosen, rest = split(results)
  return chosen, rest, len({gpu_of(r) for r in chosen + rest} - {''}) > 1


def table(results: Iterable[dict[str, Any]]) -> tables.Table:
  """The max batch and throughput of each GPU, workload, precision and memory, with its command;
  the GPU's column where the runs span more than one."""
  chosen, _, several = _split(results)
  return _table(TITLE, chosen, NOTES, several)


def others(results: Iterable[dict[str, Any]]) -> tables.Table:
  """Every other measured run, the latest of each program, memory and batch, with its command."""
  _, rest, several = _split(results)
  return _table(OTHER_TITLE, rest, [], several)


def measured_on(results: Iterable[dict[str, Any]]) -> str:
  """One line: the GPUs, the JAX versions and the dates of the measured runs (those they record)."""
  shown = latest(results)
  if not shown:
    return 'No measured runs in these results.'
  pools: dict[str, int] = {}
  for r in shown:
    device = r.get('device') or {}
    if device.get('kind'):
      pool = (device.get('pool_bytes') or 0) if memory_of(r) == FULL else 0
      pools[device['kind']] = max(pools.get(device['kind'], 0), pool)
  gpus = ', '.join(
    f'{k} ({p / 1e9:.1f} GB pool at full memory)' if p else k for k, p in pools.items()
  )
  jax = ', '.join(sorted({r['jax_version'] for r in shown if r.get('jax_version')}))
  dates = sorted(r['timestamp'][:10] for r in shown if r.get('timestamp'))
  line = 'Measured' + (f' on {gpus}' if gpus else '') + (f' with JAX {jax}' if jax else '')
  if dates:
    line += f', {dates[0]}' + ('' if dates[0] == dates[-1] else f' to {dates[-1]}')
  return f'{line}: {len(shown)} run' + ('s.' if len(shown) > 1 else '.')
