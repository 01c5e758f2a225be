"""The report's files: one Markdown page (README.md), a CSV per table, PNG bar charts."""

import os
import sys
from typing import Any

import matplotlib

matplotlib.use('Agg')  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=g-import-not-at-top

from jaxbench.cards import catalog
from jaxbench.results import (  # noqa: E402
  forecast,
  measured,
  published,
  store,
  tables,
)

# The tables of the 2020 cards, in the page's order, after the measured runs.
ORDER = ('max_batch', 'throughput', 'normalized', 'summary', 'prediction', 'forecast')
INDEX = 'README.md'
DEFAULT_REFERENCE = 'quadro_rtx_8000'

EMULATION_NOTE = (
  'Emulated rows ran on the host GPU named in the results with XLA\'s allocator capped at the '
  'card\'s memory less {overhead} MiB (driver reservation and CUDA context, see docs/sweep.md): '
  'their max batch is the emulated card\'s, their throughput is the host GPU\'s at that batch. '
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
  notes = [EMULATION_NOTE.format(overhead=catalog.CARD_OVERHEAD_BYTES // catalog.MIB)]
  if any(w in published.SWAPPED for w in data.workloads):
    notes.append(tables.SWAP_MARK.strip() + ' ' + published.SWAP_NOTE)
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
    [f'Each row divided by its own throughput on the {ref}; rows without one are left out.'],
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
  for t in out.values():
    t.notes.extend(n for n in notes if n not in t.notes)
  return out


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
        k[1] + (' tiny' if k[3] else ''),
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


def _bars(ax, data: tables.Data, grid, w: str, log: bool) -> None:
  srcs = [s for s in data.sources[w] if (w, s) in grid]
  width = 0.8 / max(len(srcs), 1)
  for i, s in enumerate(srcs):
    xs = [j + i * width for j in range(len(data.gpus))]
    ys = [grid[(w, s)].get(g, tables.Cell(None, '')).value or 0 for g in data.gpus]
    ax.bar(xs, ys, width, label=s)
  ax.set_title(w + (tables.SWAP_MARK if w in published.SWAPPED else ''), fontsize=9)
  ax.set_xticks([j + 0.4 - width / 2 for j in range(len(data.gpus))])
  ax.set_xticklabels([tables.display(g) for g in data.gpus], rotation=60, fontsize=6, ha='right')
  if log and any(c.value for s in srcs for c in grid[(w, s)].values()):
    ax.set_yscale('log')


def charts(data: tables.Data, reference: str, out_dir: str) -> list[str]:
  """Bar charts per workload (max batch, throughput) and the normalized summary; PNG paths."""
  paths = []
  for name, grid, log in (('max_batch', data.batch, True), ('throughput', data.throughput, False)):
    ws = [w for w in data.workloads if any((w, s) in grid for s in data.sources[w])]
    cols = 4
    rows = max(1, -(-len(ws) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax, w in zip(axes.flat, ws):
      _bars(ax, data, grid, w, log)
    for ax in list(axes.flat)[len(ws) :]:
      ax.axis('off')
    handles = {lab: h for ax in axes.flat for h, lab in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc='upper center', ncol=4, fontsize=8)
    fig.suptitle('Largest batch before OOM' if name == 'max_batch' else 'Throughput', y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    paths.append(os.path.join(out_dir, f'{name}.png'))
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
  summ = tables.summary(data, reference)
  fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(data.gpus)), 4))
  width = 0.8 / max(len(summ), 1)
  for i, (s, by_gpu) in enumerate(summ.items()):
    ax.bar(
      [j + i * width for j in range(len(data.gpus))],
      [by_gpu.get(g, (0, 0))[0] for g in data.gpus],
      width,
      label=s,
    )
  ax.set_xticks([j + 0.4 - width / 2 for j in range(len(data.gpus))])
  ax.set_xticklabels([tables.display(g) for g in data.gpus], rotation=45, ha='right', fontsize=8)
  ax.set_ylabel(f'throughput / {catalog.get(reference).display}')
  ax.legend(fontsize=8)
  fig.tight_layout()
  paths.append(os.path.join(out_dir, 'normalized.png'))
  fig.savefig(paths[-1], dpi=100)
  plt.close(fig)
  return paths


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
  """Render the store(s) into out_dir: README.md (the measured runs, then the 2020 cards' tables
  beside the published figures, the charts and the command that renders it again), one CSV per
  table and the PNG charts; the paths written."""
  if isinstance(store_paths, str):
    store_paths = [store_paths]
  records = read(store_paths)
  data = tables.collect(records)
  built = {
    'measured': measured.table(records),
    'measured_other': measured.others(records),
    **build_tables(data, reference, records),
  }
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  for name in ('measured', 'measured_other') + ORDER:
    paths.append(os.path.join(out_dir, f'{name}.csv'))
    with open(paths[-1], 'w') as f:
      f.write(built[name].csv())
  pngs = charts(data, reference, out_dir)
  names = [os.path.basename(p) for p in store_paths]
  links = ', '.join(f'[{n}]({os.path.relpath(p, out_dir)})' for n, p in zip(names, store_paths))
  md = [
    '# jaxbench results',
    '',
    f'{measured.measured_on(records)} Rendered from {links} ({len(records)} results), every '
    'table also as CSV beside this page.',
    '',
    '## Measured runs',
    '',
    built['measured'].markdown(),
    '',
    built['measured_other'].markdown(),
    '',
    '## The 2020 cards',
    '',
    f'Max batch and throughput on the 2020 benchmark\'s cards, emulated or predicted, beside the '
    f'published figures ({published.SOURCE}).',
    '',
  ]
  md += [built[name].markdown() + '\n' for name in ORDER]
  md += [f'![{os.path.basename(p)}]({os.path.basename(p)})' for p in pngs]
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
