"""JAX beside PyTorch on the same GPU: a row per GPU, workload, precision, memory and batch with
a measured JAX result and a measured PyTorch one (eager, torch.compile or both), and the ratio of
JAX's throughput to the better PyTorch's."""

import datetime
import math
from typing import Any, Iterable

from jaxbench.results import commands, measured, records, store, tables

TITLE = 'JAX and PyTorch on the same GPU, precision, memory and batch'
# jaxbench's aim beside PyTorch: at the same batch and precision, JAX's throughput at least this
# many times the better of PyTorch eager and torch.compile.
GOAL = 1.15
SIDES = ('jax', 'eager', 'compiled')
HEADER = [
  'workload',
  'precision',
  'GPU',
  'memory',
  'batch',
  'JAX',
  'PyTorch eager',
  'PyTorch compiled',
  'JAX / PyTorch',
  'against 1.15x',
  'peak memory JAX',
  'peak memory PyTorch',
  'date',
  'form',
  'commands',
]
NOTES = [
  'JAX / PyTorch: JAX\'s throughput over the better of PyTorch eager and torch.compile '
  '(--torch_compile), named where both ran, on the same GPU at the same precision, memory and '
  'batch; a `--frameworks=jax,pytorch` command measures both with the same warm-up steps, timed '
  'windows and median step.',
  'batch: a fixed batch (--batch_size) pairs only with the same batch; "max J / P" pairs two '
  'max-batch searches: JAX\'s max batch, PyTorch\'s (eager\'s and compiled\'s where they '
  'differ), and JAX\'s over the larger PyTorch one. memory: as in the measured tables.',
  f'against {GOAL}x: at a fixed batch, whether JAX runs at least {GOAL} times the better '
  'PyTorch side, jaxbench\'s aim, and if not, the speed-up it lacks ("short: JAX needs +8%"); '
  '"compiled not run" where torch.compile has no run to compare. The rows short of it, and what '
  'their profiles showed, are in docs/performance.md ("Beside PyTorch at the comparison batch"). '
  '"-" for max-batch searches, whose sides ran at different batches.',
  'PyTorch compiled: its throughput and, in parentheses, its first step: torch.compile\'s '
  'compile and autotuning. peak memory: JAX\'s is the compiled step\'s forecast (XLA\'s memory '
  'analysis), PyTorch\'s the allocator\'s measured peak. commands: the command of each side\'s '
  'run, in the order of the columns. form: as in the measured tables, of the JAX run. "-": not '
  'measured.',
]
EMPTY = 'No workload in these results has both a measured JAX and a measured PyTorch run.'


def side(r: dict[str, Any]) -> str:
  """'jax', or the PyTorch mode: 'eager' or 'compiled' (--torch_compile)."""
  if records.framework(r) == 'jax':
    return 'jax'
  return 'compiled' if r.get('torch_compile') else 'eager'


def key(r: dict[str, Any]) -> tuple:
  """What the sides of a row share: the GPU, workload, precision, preset, `--set` overrides,
  memory, devices and batch (a fixed one; None for a max-batch search). A JAX run with an override
  that changes its program (such as attention_probs=recomputed) or with compiler settings away from
  the defaults (--triton_gemm, XLA flags of its own) pairs with no PyTorch run; an override that
  names a default value changes nothing."""
  return (
    (r.get('device') or {}).get('kind'),
    r['workload'],
    r['precision'],
    bool(r.get('tiny')),
    commands.changing_sets(r),
    records.compiler(r),
    measured.memory_of(r),
    measured.devices_of(r),
    r['max_batch'] if measured.is_fixed(r) else None,
  )


def _time(r: dict[str, Any]) -> float:
  """A record's timestamp in seconds (-inf without one)."""
  stamp = r.get('timestamp')
  return datetime.datetime.fromisoformat(stamp).timestamp() if stamp else -math.inf


def pairs(results: Iterable[dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
  """Per row, side() -> a measured result of that side, for each key with a JAX result and at
  least one PyTorch one: the latest PyTorch run of each mode, and the JAX run nearest in time to
  the latest of them (the later of two as near), so that a row's sides come from one
  `--frameworks` command where one ran them; in the 2020 workload order, then precision, memory
  and batch."""
  found: dict[tuple, dict[str, Any]] = {}
  for r in sorted(results, key=lambda r: r.get('timestamp') or ''):
    if measured.is_measured(r):
      by = found.setdefault(key(r), {'jax': []})
      if side(r) == 'jax':
        by['jax'].append(r)
      else:
        by[side(r)] = r
  rows = []
  for by in found.values():
    runs = by.pop('jax')
    if runs and by:
      when = max(_time(r) for r in by.values())
      by['jax'] = min(reversed(runs), key=lambda r: abs(_time(r) - when))
      rows.append(by)
  return sorted(rows, key=lambda by: (measured.order(by['jax']), key(by['jax'])[0] or ''))


def _unit(r: dict[str, Any]) -> str:
  return r['unit'][:-1] if r['max_batch'] == 1 and r['unit'].endswith('s') else r['unit']


def _count(r: dict[str, Any]) -> str:
  return ('≥' if store.lower_bound(r) else '') + f'{r["max_batch"]:,}'


def batch(by: dict[str, dict[str, Any]]) -> str:
  """The fixed batch, or each side's max batch and JAX's over the larger PyTorch one."""
  j = by['jax']
  if measured.is_fixed(j):
    return f'{j["max_batch"]:,} {_unit(j)}'
  torch = [by[m] for m in SIDES[1:] if m in by]
  if len({t['max_batch'] for t in torch}) == 1:
    shown = _count(torch[0])
  else:
    shown = ' / '.join(f'{_count(by[m])} {m}' for m in SIDES[1:])
  larger = max(t['max_batch'] for t in torch)
  ratio = f', {j["max_batch"] / larger:.2f}x' if larger else ''
  return f'max {_count(j)} / {shown} {_unit(j)}{ratio}'


def _rate(r: dict[str, Any]) -> float:
  return r['measurement']['units_per_s']


def throughput(r: dict[str, Any] | None) -> str:
  """A side's throughput, '-' where it did not run; a compiled side's compile time after it."""
  if r is None:
    return '-'
  text = f'{measured.figure(_rate(r))} {r["throughput_unit"]}'
  compile_s = r['measurement'].get('compile_s')
  if r.get('torch_compile') and compile_s is not None:
    text += f' (compile {compile_s:.1f} s)'
  return text


def ratio(by: dict[str, dict[str, Any]]) -> str:
  """JAX's throughput over the better PyTorch side's, naming that side where both ran."""
  torch = [m for m in SIDES[1:] if m in by]
  better = max(torch, key=lambda m: _rate(by[m]))
  text = f'{_rate(by["jax"]) / _rate(by[better]):.2f}x'
  return text + (f' over {better}' if len(torch) > 1 else '')


def against_goal(by: dict[str, dict[str, Any]]) -> str:
  """At a fixed batch, whether JAX's throughput is GOAL times the better PyTorch side's, or
  the speed-up it lacks; '-' for max-batch searches (their sides ran at different batches)."""
  if not measured.is_fixed(by['jax']):
    return '-'
  better = max(_rate(by[m]) for m in SIDES[1:] if m in by)
  need = GOAL * better / _rate(by['jax'])
  text = 'met' if need <= 1 else f'short: JAX needs +{math.ceil((need - 1) * 100)}%'
  return text + ('' if 'compiled' in by else ', compiled not run')


def _peak(r: dict[str, Any]) -> int | None:
  m = r['measurement']
  return m.get('predicted_peak_bytes' if side(r) == 'jax' else 'process_peak_bytes')


def peak_torch(by: dict[str, dict[str, Any]]) -> str:
  torch = [m for m in SIDES[1:] if m in by]
  if len(torch) == 1:
    return records.human_bytes(_peak(by[torch[0]]))
  return ', '.join(f'{records.human_bytes(_peak(by[m]))} {m}' for m in torch)


def _dates(by: dict[str, dict[str, Any]]) -> str:
  dates = sorted({r['timestamp'][:10] for r in by.values() if r.get('timestamp')})
  if not dates:
    return ''
  return dates[0] if len(dates) == 1 else f'{dates[0]} to {dates[-1]}'


def row(by: dict[str, dict[str, Any]]) -> list[str]:
  j = by['jax']
  return [
    j['workload'],
    j['precision'] + (' tiny' if j.get('tiny') else ''),
    (j.get('device') or {}).get('kind') or '',
    measured.memory_of(j),
    batch(by),
    throughput(j),
    throughput(by.get('eager')),
    throughput(by.get('compiled')),
    ratio(by),
    against_goal(by),
    records.human_bytes(_peak(j)),
    peak_torch(by),
    _dates(by),
    commands.earlier_form(j) or '',
    '; '.join(commands.command_of(by[s]) for s in SIDES if s in by),
  ]


def table(results: Iterable[dict[str, Any]]) -> tables.Table:
  """JAX beside PyTorch eager and compiled, a row per GPU, workload, precision, memory and batch
  that both measured."""
  rows = [row(by) for by in pairs(results)]
  return tables.Table(TITLE, list(HEADER), rows, NOTES if rows else [EMPTY, *NOTES], ('commands',))
