"""The report's PNG charts: max batch and throughput per workload, throughput normalized to a
reference GPU, and a workload x GPU map of the max batch (the 2020 article's first table).

Each source keeps one colour in every panel and chart: a hue per kind (published 2020, emulated,
predicted on the GPU, predicted deviceless, measured), darker for wider precisions. OOM cells are
marked OOM at the axis, lower bounds (a search stopped at --max_examples) hatched with "≥".
"""

import math
import os

import matplotlib

matplotlib.use('Agg')  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=g-import-not-at-top
from matplotlib import colors as mcolors  # noqa: E402  pylint: disable=g-import-not-at-top
from matplotlib import patches  # noqa: E402  pylint: disable=g-import-not-at-top

from jaxbench.cards import catalog  # noqa: E402
from jaxbench.results import published, tables  # noqa: E402

# Hue per kind of source, shade per precision (fp32 darkest).
KINDS = {
  'published': ('#000000', '#555555', '#888888', '#aaaaaa'),
  'emulated': ('#08519c', '#3182bd', '#6baed6', '#9ecae1'),
  'predicted': ('#a63603', '#e6550d', '#fd8d3c', '#fdae6b'),
  'deviceless': ('#006d2c', '#31a354', '#74c476', '#a1d99b'),
  'measured': ('#54278f', '#756bb1', '#9e9ac8', '#bcbddc'),
}
PRECISIONS = ('fp32', 'tf32', 'bf16', 'fp16')
OOM_TEXT = 'OOM'
DPI = 100
LEGEND_COLUMNS = 4


def colour(source: str) -> str:
  """The fixed colour of a source: its kind's hue, its precision's shade."""
  shades = KINDS[tables.kind_of(source)]
  words = source.replace('(', ' ').replace(')', ' ').split()
  precision = next((p for p in PRECISIONS if p in words), 'fp32')
  return shades[PRECISIONS.index(precision)]


def _order(sources: list[str]) -> list[str]:
  kinds = list(KINDS)
  return sorted(set(sources), key=lambda s: (kinds.index(tables.kind_of(s)), s))


def _legend(fig, sources: list[str], labels: dict[str, str], top: float) -> None:
  """One entry per source, in one row band under the title."""
  handles = [patches.Patch(facecolor=colour(s), label=labels.get(s, s)) for s in sources]
  fig.legend(
    handles=handles,
    loc='upper center',
    bbox_to_anchor=(0.5, top),
    ncol=min(len(handles), LEGEND_COLUMNS),
    fontsize=8,
    frameon=False,
  )


def _bars(ax, gpus: list[str], rows: dict[str, dict[str, tables.Cell]], log: bool) -> None:
  """Grouped bars per GPU, one per source; OOM as text at the axis, lower bounds hatched."""
  srcs = list(rows)
  width = 0.8 / max(len(srcs), 1)
  values = [c.value for cells in rows.values() for c in cells.values() if c.value]
  if log and values:
    ax.set_yscale('log')
  floor = min(values) / 2 if log and values else 0
  for i, s in enumerate(srcs):
    for j, g in enumerate(gpus):
      cell = rows[s].get(g)
      if cell is None:
        continue
      x = j + (i - (len(srcs) - 1) / 2) * width
      if cell.value:
        ax.bar(
          x,
          cell.value - floor if log else cell.value,
          width,
          bottom=floor if log else 0,
          color=colour(s),
          label=s,  # the bar's source (no axis legend: the figure has one)
          hatch='///' if cell.at_least else None,
          edgecolor='white' if cell.at_least else None,
          linewidth=0,
        )
        if cell.at_least:
          ax.text(x, cell.value, '≥', ha='center', va='bottom', fontsize=7, color=colour(s))
      elif cell.text == OOM_TEXT:
        ax.text(
          x,
          0.02,
          OOM_TEXT,
          transform=ax.get_xaxis_transform(),
          rotation=90,
          ha='center',
          va='bottom',
          fontsize=6,
          fontweight='bold',
          color=colour(s),
        )
  ax.set_xticks(range(len(gpus)))
  ax.set_xticklabels([tables.display(g) for g in gpus], rotation=60, fontsize=6, ha='right')
  ax.set_xlim(-0.5, len(gpus) - 0.5)
  ax.tick_params(axis='y', labelsize=7)


def _units(data: tables.Data) -> dict[str, tuple[str, str]]:
  """workload -> (batch unit, throughput unit), from the results or the published table."""
  out = {r.workload: (r.batch_unit, r.throughput_unit) for r in published.rows()}
  for r in data.records:
    out.setdefault(r['workload'], (r.get('unit', 'examples'), r.get('throughput_unit', '/s')))
  return out


def _panels(
  data: tables.Data,
  grids: dict[str, dict[str, dict[str, tables.Cell]]],
  title: str,
  ylabel,
  log: bool,
  labels: dict[str, str],
  xlabel: str = 'GPU',
):
  """One panel per workload in `grids` (workload -> source -> gpu -> Cell), one legend."""
  ws = [w for w in grids if grids[w]]
  cols = 4
  rows = max(1, -(-len(ws) // cols))
  gpus = [g for g in data.gpus if any(g in c for w in ws for c in grids[w].values())]
  sources = _order([s for w in ws for s in grids[w]])
  band = 0.22 * (1 + (len(sources) - 1) // LEGEND_COLUMNS) + 0.1  # inches: the legend's rows
  height = 3.3 * rows + 0.5 + band
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, height), squeeze=False)
  for ax, w in zip(axes.flat, ws):
    _bars(ax, gpus, {s: grids[w][s] for s in _order(list(grids[w]))}, log)
    ax.set_title(w + (tables.SWAP_MARK if w in published.SWAPPED else ''), fontsize=9)
    ax.set_ylabel(ylabel(w), fontsize=7)
    ax.set_xlabel(xlabel, fontsize=7)
  for ax in list(axes.flat)[len(ws) :]:
    ax.axis('off')
  fig.suptitle(title, y=1 - 0.1 / height, va='top', fontsize=12)
  _legend(fig, sources, labels, 1 - 0.45 / height)
  fig.tight_layout(rect=(0, 0, 1, 1 - (0.2 + band) / height))
  return fig


def _measured_on(data: tables.Data) -> str:
  kinds = sorted(
    {
      (r.get('device') or {}).get('kind') or 'the measuring GPU'
      for r in data.records
      if r.get('mode') != 'predict'
    }
  )
  return ', '.join(kinds) or 'the measuring GPU'


def max_batch(data: tables.Data):
  """Max batch per workload (a panel each) and GPU, every source, log scale."""
  units = _units(data)
  grids = {
    w: {s: data.batch[(w, s)] for s in data.sources[w] if (w, s) in data.batch}
    for w in data.workloads
  }
  return _panels(
    data,
    grids,
    'Largest batch before OOM, per workload and GPU',
    lambda w: f'max batch ({units.get(w, ("examples",))[0]}, log scale)',
    True,
    {},
  )


def throughput(data: tables.Data):
  """Throughput per workload and GPU: the published figures and the emulated ones."""
  units = _units(data)
  grids = {
    w: {s: data.throughput[(w, s)] for s in data.sources[w] if (w, s) in data.throughput}
    for w in data.workloads
  }
  host = _measured_on(data)
  labels = {
    s: f"{s}: {host}'s speed at the card's max batch"
    for w in grids
    for s in grids[w]
    if tables.kind_of(s) == 'emulated'
  }
  return _panels(
    data,
    grids,
    'Throughput at the largest batch (emulated: the measuring GPU at the card\'s batch)',
    lambda w: f'throughput ({units.get(w, ("", "units/s"))[1]})',
    False,
    labels,
  )


def normalized(data: tables.Data, reference: str):
  """Per workload, each source's throughput over its own on the reference GPU (sources with
  throughput on the reference and another GPU only), then the geometric mean over workloads."""
  norm = tables.normalized(data, reference)
  grids: dict[str, dict[str, dict[str, tables.Cell]]] = {}
  for (w, s), by_gpu in norm.items():
    grids.setdefault(w, {})[s] = {g: tables.Cell(v, f'{v:.2f}') for g, v in by_gpu.items()}
  grids = {w: grids[w] for w in data.workloads if w in grids}
  mean = 'geometric mean over workloads'
  grids[mean] = {
    s: {g: tables.Cell(v, f'{v:.2f}') for g, (v, _) in by_gpu.items()}
    for s, by_gpu in tables.summary(data, reference).items()
  }
  ref = catalog.get(reference).display
  return _panels(
    data,
    grids,
    f'Throughput normalized to the {ref}',
    lambda w: f'throughput / {ref}\'s (same source)',
    False,
    {},
  )


# Which of our sources speaks for a cell of the map: a run before a prediction.
_RANK = ('emulated', 'measured', 'predicted', 'deviceless')


def fit_map(data: tables.Data):
  """Workload x GPU: the 2020 published max batch beside ours (emulated or measured where run,
  else predicted on the GPU, else deviceless; at the published precision), OOM marked."""
  pub = published.lookup()
  # The precision each workload's 2020 run trained in ('fp32?' where the article did not say it).
  precision = {w: p.rstrip('?') for w, p in published.trained_precision().items()}
  ws = list(data.workloads)
  panels = []
  for title in (
    '2020 published',
    'ours: run (emulated or measured), else predicted, else deviceless',
  ):
    gpus = published.gpus() if title.startswith('2020') else list(data.gpus)
    grid, kinds = [], []
    for w in ws:
      row, row_kinds = [], []
      for g in gpus:
        cell, kind = None, ''
        if title.startswith('2020'):
          p = pub.get((w, g))
          if p is not None:
            cell = tables.Cell(float(p.max_batch) if p.max_batch else None, str(p.max_batch))
            cell = cell if p.max_batch else tables.Cell(None, OOM_TEXT)
        else:
          for want in _RANK:
            for s in data.sources[w]:
              if tables.kind_of(s) != want or precision.get(w, 'fp32') not in s.split():
                continue
              c = data.batch.get((w, s), {}).get(g)
              if c is not None and (c.value or c.text == OOM_TEXT):
                cell, kind = c, want
                break
            if cell is not None:
              break
        row.append(cell)
        row_kinds.append(kind)
      grid.append(row)
      kinds.append(row_kinds)
    panels.append((title, gpus, grid, kinds))
  widths = [len(p[1]) for p in panels]
  fig, axes = plt.subplots(
    1,
    2,
    figsize=(2.6 + 0.62 * sum(widths), 1.8 + 0.42 * len(ws)),
    squeeze=False,
    gridspec_kw={'width_ratios': widths},
  )
  cmap = plt.get_cmap('viridis')
  marks = {'emulated': '', 'measured': '', 'predicted': '*', 'deviceless': '+'}
  for ax, (title, gpus, grid, kinds) in zip(axes.flat, panels):
    for i in range(len(ws)):
      top = max((c.value for c in grid[i] if c is not None and c.value), default=None)
      for j, cell in enumerate(grid[i]):
        if cell is None:
          ax.add_patch(patches.Rectangle((j - 0.5, i - 0.5), 1, 1, color='white'))
          continue
        if not cell.value:
          ax.add_patch(
            patches.Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor='#f4a6a6', edgecolor='#d62728')
          )
          ax.text(j, i, OOM_TEXT, ha='center', va='center', fontsize=6.5, fontweight='bold')
          continue
        # Shade within the row: units differ between workloads (images, tokens).
        share = math.log(cell.value) / math.log(top) if top and top > 1 else 1.0
        face = cmap(0.25 + 0.7 * max(0.0, min(1.0, share)))
        ax.add_patch(patches.Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=face))
        text = ('≥' if cell.at_least else '') + _short(cell.value) + marks.get(kinds[i][j], '')
        ink = 'black' if mcolors.rgb_to_hsv(face[:3])[2] > 0.6 else 'white'
        ax.text(j, i, text, ha='center', va='center', fontsize=6.5, color=ink)
    ax.set_xlim(-0.5, len(gpus) - 0.5)
    ax.set_ylim(len(ws) - 0.5, -0.5)
    ax.set_xticks(range(len(gpus)))
    ax.set_xticklabels([tables.display(g) for g in gpus], rotation=60, ha='right', fontsize=7)
    ax.set_yticks(range(len(ws)))
    ax.set_yticklabels(ws, fontsize=8)
    ax.set_xlabel('GPU', fontsize=8)
    ax.set_ylabel('workload (max batch in its unit)', fontsize=8)
    ax.set_title(title, fontsize=9)
  fig.suptitle(
    'Which GPU trains which workload: the largest batch that fits (OOM: not one example)',
    fontsize=11,
  )
  fig.text(
    0.5,
    0.005,
    'Shade: the batch on a log scale within each workload. Ours at the published precision: '
    'unmarked run (emulated, or measured on the GPU itself), * predicted on the GPU, + predicted '
    'deviceless; ≥ a lower bound. '
    'Blank: not in the results.',
    ha='center',
    va='bottom',
    fontsize=7,
  )
  fig.tight_layout(rect=(0, 0.03, 1, 0.95))
  return fig


def _short(value: float) -> str:
  """A batch in a map's cell: 26760 -> '26.8k'."""
  return f'{value / 1000:.1f}k' if value >= 10000 else f'{value:g}'


def write(data: tables.Data, reference: str, out_dir: str) -> list[str]:
  """Every chart of the report, into out_dir; the PNG paths."""
  paths = []
  for name, make in (
    ('fit_map', lambda: fit_map(data)),
    ('max_batch', lambda: max_batch(data)),
    ('throughput', lambda: throughput(data)),
    ('normalized', lambda: normalized(data, reference)),
  ):
    fig = make()
    paths.append(os.path.join(out_dir, f'{name}.png'))
    fig.savefig(paths[-1], dpi=DPI)
    plt.close(fig)
  return paths
