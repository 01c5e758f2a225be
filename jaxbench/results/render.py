"""The report's files: one Markdown page (README.md), a CSV per table, a tidy CSV of every
figure (results.csv) and the PNG charts (charts.py)."""

import os
import sys
from typing import Any

from jaxbench.cards import catalog
from jaxbench.results import charts, forecast, measured, published, side_by_side, store, tables

# The tables of the 2020 cards, in the page's order, after the measured runs.
ORDER = ('max_batch', 'throughput', 'normalized', 'summary', 'prediction', 'forecast')
# The tables before them, each a CSV of this name: the measured runs, then JAX beside PyTorch.
MEASURED = ('measured', 'measured_other', 'jax_pytorch')
INDEX = 'README.md'
TIDY = 'results.csv'
DEFAULT_REFERENCE = 'quadro_rtx_8000'

EMULATION_NOTE = (
  'Emulated rows ran on the GPU named above with XLA\'s allocator capped at the '
  'card\'s memory less {overhead} MiB (driver reservation and CUDA context, see docs/sweep.md): '
  'their max batch is the emulated card\'s, their throughput is that GPU\'s at that batch. '
  'Predicted rows come from the compile-time memory model and ran nothing; "deviceless" ones '
  'were compiled for the GPU on a host without it (--compile_for; no autotuning, see '
  'docs/sweep.md).'
)
BATCH_NOTE = (
  'Max batch in each workload\'s unit (images, sequences, or tokens = '
  'max_tokens); OOM: not one example fits. The published batches are ladder '
  'values, not exact maxima.'
)


def build_tables(
  data: tables.Data, reference: str, records: list[dict[str, Any]] | None = None
) -> dict[str, tables.Table]:
  """name -> Table: max batch, throughput, normalized throughput, its summary, prediction error,
  and the deviceless forecasts' gap, from every record given (`records`; default the latest of
  each cell), full-memory runs and superseded results included: each trial is a forecast."""
  out = {
    'max_batch': tables.metric_table(data, data.batch, 'Largest batch before OOM', BATCH_NOTE),
    'throughput': tables.metric_table(
      data,
      data.throughput,
      'Throughput at the largest batch',
      'images/s, sequences/s or target tokens ("words")/s, as in 2020.',
    ),
  }
  norm = tables.normalized(data, reference)
  ref = catalog.get(reference).display
  header = ['workload', 'source'] + [tables.display(g) for g in data.gpus]
  out['normalized'] = tables.Table(
    f'Throughput normalized to the {ref}',
    header,
    [
      [w, s] + [f'{by_gpu[g]:.2f}' if g in by_gpu else '' for g in data.gpus]
      for (w, s), by_gpu in sorted(
        norm.items(),
        key=lambda kv: (data.workloads.index(kv[0][0]), kv[0][1] != tables.PUBLISHED, kv[0][1]),
      )
    ],
    [
      f'Each row divided by its own throughput on the {ref}; rows without throughput on the '
      f'{ref} and another GPU are left out.'
    ],
  )
  summ = tables.summary(data, reference)
  out['summary'] = tables.Table(
    f'Mean throughput normalized to the {ref} (geometric mean over workloads)',
    ['source'] + [tables.display(g) for g in data.gpus],
    [
      [s] + [f'{by_gpu[g][0]:.2f} ({by_gpu[g][1]})' if g in by_gpu else '' for g in data.gpus]
      for s, by_gpu in summ.items()
    ],
    ['In parentheses: the number of workloads averaged.'],
  )
  out['prediction'] = prediction_table(data.records)
  out['forecast'] = forecast_table(data.records if records is None else records)
  return out


def cards_notes(data: tables.Data) -> list[str]:
  """What every table of the 2020 cards shares, said once above them: where their cells were
  measured or compiled, what emulated and predicted mean, what a column is, the swapped rows."""
  notes = [cards_measured_on(data.records)]
  notes.append(EMULATION_NOTE.format(overhead=catalog.CARD_OVERHEAD_BYTES // catalog.MIB))
  notes.append(
    'Columns: the eight 2020 cards, then the other cards in the results, by their names; a column '
    'named "N GB card" is a raw memory size (--memory_gb=N): a card with N GB, less the same '
    'overhead, that the catalog does not name. Rows: the published figures, then ours by source '
    '(emulated, predicted, deviceless) and precision, then each of ours over the published one.'
  )
  notes.append(published.precision_note())
  if any(tables.has_earlier_revision(s) for w in data.workloads for s in data.sources[w]):
    notes.append(
      'A row whose source ends in ", revision N" ran or compiled revision N of the workload, an '
      'earlier program than today\'s (docs/workloads.md says what changed); a row without it, '
      'today\'s.'
    )
  if any(w in published.SWAPPED for w in data.workloads):
    notes.append(tables.SWAP_MARK.strip() + ' ' + published.SWAP_NOTE)
  return notes


def cards_measured_on(results: list[dict[str, Any]]) -> str:
  """One line: the GPU that ran the emulated cells and compiled the predicted ones, the host of
  the deviceless ones, with their JAX versions and dates."""
  parts = []
  for kind, what in (
    ('emulated', 'Emulated cells ran on'),
    ('predicted', 'predicted cells were compiled on'),
    ('deviceless', 'deviceless ones were compiled for'),
  ):
    mine = [r for r in results if tables.kind_of(tables.source_label(r)) == kind]
    if not mine:
      continue
    kinds = ', '.join(sorted({(r.get('device') or {}).get('kind') or 'a GPU' for r in mine}))
    jax = ', '.join(sorted({r['jax_version'] for r in mine if r.get('jax_version')}))
    dates = sorted(r['timestamp'][:10] for r in mine if r.get('timestamp'))
    span = f'{dates[0]}' + ('' if dates[0] == dates[-1] else f' to {dates[-1]}') if dates else ''
    extra = ', '.join(x for x in (f'JAX {jax}' if jax else '', span) if x)
    where = ' on a host without it' if kind == 'deviceless' else ''
    parts.append(f'{what} {kinds}{where}' + (f' ({extra})' if extra else ''))
  if not parts:
    return 'No emulated or predicted cells in these results.'
  return '; '.join(parts) + '.'


ON_DEVICE, DEVICELESS = 'on the GPU', 'deviceless'


def prediction_table(records: list[dict[str, Any]]) -> tables.Table:
  """Predicted vs emulated max batch, cell by cell, and the error measured.

  A cell may have two predictions: compiled on the GPU itself (`--predict`) and compiled for it
  on a host without one (`--compile_for`, no autotuning); each gets its row and its error.
  """
  runs, preds = {}, {}
  for r in records:
    k = (
      r['workload'],
      r['precision'],
      r['emulation']['gpu'],
      bool(r.get('tiny')),
      tuple(map(tuple, r.get('overrides') or [])),
      store.revision(r),  # a prediction is checked against a run of the same program only
    )
    if r.get('mode') == 'predict':
      how = DEVICELESS if (r.get('device') or {}).get('deviceless') else ON_DEVICE
      preds[k + (how,)] = r
    else:
      runs[k] = r
  rows, bounds = [], 0
  errors: dict[str, list[float]] = {ON_DEVICE: [], DEVICELESS: []}
  for pk in sorted(pk for pk in preds if pk[:-1] in runs):
    k, how = pk[:-1], pk[-1]
    p, m = preds[pk], runs[k]
    if p['status'] not in ('ok', 'oom') or m['status'] not in ('ok', 'oom', 'invalid'):
      continue
    if store.lower_bound(p) or store.lower_bound(m):
      bounds += 1  # a lower bound (--max_examples) is no maximum to measure an error against
      continue
    err = (p['max_examples'] - m['max_examples']) / m['max_examples'] if m['max_examples'] else None
    if err is not None:
      errors[how].append(err)
    rows.append(
      [
        k[0],
        k[1] + (' tiny' if k[3] else '') + tables.earlier_revision(m),
        tables.display(k[2]),
        how,
        str(p['max_batch']),
        str(m['max_batch']),
        '' if err is None else f'{100 * err:+.1f}%',
      ]
    )
  notes = []
  for how, errs in errors.items():
    if errs:
      mae = 100 * sum(map(abs, errs)) / len(errs)
      notes.append(
        f'Predicted {how}: {len(errs)} cells, mean absolute error {mae:.1f}%'
        f', {sum(e == 0 for e in errs)} exact, {sum(e > 0 for e in errs)} over-predicted'
      )
  note = '; '.join(notes) if notes else 'No cell has both a prediction and an emulated run yet.'
  if bounds:
    note += f' ({bounds} left out: a search stopped at --max_examples, a lower bound only)'
  return tables.Table(
    'Predicted vs emulated max batch',
    ['workload', 'precision', 'GPU', 'predicted', 'predicted max', 'emulated max', 'error'],
    rows,
    [
      note,
      'Error = (predicted - emulated) / emulated, in examples. "on the GPU": --predict, '
      'compiled on the device itself; "deviceless": --compile_for, compiled for the device on a '
      'host without one (no autotuning).',
    ],
  )


def forecast_table(records: list[dict[str, Any]]) -> tables.Table:
  """Deviceless forecasts against the GPU's own at the same batches, per workload: the error
  of a deviceless prediction's memory model, wherever the results hold both."""
  found = forecast.gaps(records)
  rows = []
  for name, worst in sorted(forecast.largest(found).items()):
    mine = [g for g in found if g.name == name]
    low = min(g.deviceless - g.on_device for g in mine)
    high = max(g.deviceless - g.on_device for g in mine)
    workload, precision = name.split(' ', 1)
    rows.append(
      [
        workload,
        precision,
        str(len(mine)),
        f'{low / 1e6:+,.0f} to {high / 1e6:+,.0f}',
        f'{100 * worst.relative:+.2f}% (at {worst.examples:,})',
      ]
    )
  return tables.Table(
    'Deviceless forecasts vs the GPU\'s own',
    ['workload', 'precision', 'batches compiled both ways', 'deviceless - GPU, MB', 'largest gap'],
    rows,
    [
      'Each batch compiled both ways: for the GPU on a host without it (--compile_for) and on '
      'the GPU, the same program (workload, precision, config, JAX version, XLA flags), any '
      'memory cap. Gap = (deviceless - GPU) / GPU of the predicted peak. '
      + (
        'A negative gap is where a deviceless prediction can say a batch fits that does not: '
        'the GPU\'s autotuner picks convolution algorithms with larger workspaces than a '
        'compile without it (docs/sweep.md).'
        if rows
        else 'No batch was compiled both ways in these results.'
      )
    ],
  )


def read(store_paths: list[str]) -> list[dict[str, Any]]:
  """The results of each store in order; a line that is not a whole result is reported once on
  stderr and skipped (store.read)."""
  out = []
  for path in store_paths:
    more, warning = store.read(path)
    if warning:
      print(warning, file=sys.stderr)
    out += more
  return out


def command(store_paths: list[str], out_dir: str, reference: str) -> str:
  """The report command that renders these stores into out_dir again."""
  line = f'python -m jaxbench.report_main --store={",".join(store_paths)} --out={out_dir}'
  return line + ('' if reference == DEFAULT_REFERENCE else f' --reference_gpu={reference}')


def write(store_paths: str | list[str], out_dir: str, reference: str) -> list[str]:
  """Render the store(s) into out_dir: README.md (the measured runs, JAX beside PyTorch, then the
  2020 cards' tables beside the published figures, the charts and the command that renders it
  again), one CSV per table and the PNG charts; the paths written."""
  if isinstance(store_paths, str):
    store_paths = [store_paths]
  records = read(store_paths)
  own = [
    r
    for r in measured.split(records)[0]
    if measured.memory_of(r) == measured.FULL and (r.get('search') or {}).get('mode') != 'fixed'
  ]
  data = tables.collect(records, own)
  built = {
    'measured': measured.table(records),
    'measured_other': measured.others(records),
    'jax_pytorch': side_by_side.table(records),
    **build_tables(data, reference, records),
  }
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  for name in MEASURED + ORDER:
    paths.append(os.path.join(out_dir, f'{name}.csv'))
    with open(paths[-1], 'w') as f:
      f.write(built[name].csv())
  paths.append(os.path.join(out_dir, TIDY))
  with open(paths[-1], 'w') as f:
    f.write(tables.tidy_csv(tables.tidy(data, measured.latest(records))))
  pngs = charts.write(data, reference, out_dir)
  names = [os.path.basename(p) for p in store_paths]
  links = ', '.join(f'[{n}]({os.path.relpath(p, out_dir)})' for n, p in zip(names, store_paths))
  md = [
    '# jaxbench results',
    '',
    f'{measured.measured_on(records)} Rendered from {links} ({len(records)} results), every '
    f'table also as CSV beside this page, and every figure in one CSV, a row per source, '
    f'workload, precision and GPU, numbers as numbers ([{TIDY}]({TIDY})).',
    '',
    '## Measured runs',
    '',
    built['measured'].markdown(),
    '',
    built['measured_other'].markdown(),
    '',
    '## JAX beside PyTorch',
    '',
    built['jax_pytorch'].markdown(),
    '',
    '## The 2020 cards',
    '',
    f'Max batch and throughput on the 2020 benchmark\'s cards, emulated or predicted, beside the '
    f'published figures ({published.SOURCE}).',
    '',
    *[f'- {n}' for n in cards_notes(data)],
    '',
  ]
  md += [built[name].markdown() + '\n' for name in ORDER]
  md += [
    '## Charts',
    '',
    'Each source has one colour in every chart: black the published 2020 figures, blue emulated, '
    'orange predicted on the GPU, green predicted deviceless, darker for fp32 than for fp16. OOM '
    'is written at the axis; a hatched bar with "≥" is a lower bound. An emulated throughput is '
    'the measuring GPU\'s speed at the card\'s max batch, not the card\'s own.',
    '',
  ]
  md += [f'![{os.path.basename(p)}]({os.path.basename(p)})\n' for p in pngs]
  md += [
    '',
    '## Rendering',
    '',
    'This page, its CSV files and its charts are rendered from the results files named at the '
    f'top, from the repository\'s root, by `{command(store_paths, out_dir, reference)}`.',
  ]
  paths.append(os.path.join(out_dir, INDEX))
  with open(paths[-1], 'w') as f:
    f.write('\n'.join(md) + '\n')
  return paths + pngs
