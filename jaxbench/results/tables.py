"""The 2020 layout from a store: rows workloads, columns GPUs, published figures beside ours.

For each workload the published 2020 row comes first, then one row per source found in the
store (emulated runs, compile-only predictions; by precision), then each source's ratio to
the published row. Throughput is also normalized to a reference GPU within each row, and
summarized over workloads by a geometric mean, as the 2020 chart did.
"""

import csv
import dataclasses
import io
import math
from typing import Any

from jaxbench.cards import catalog
from jaxbench.results import published, store
from models import registry

PUBLISHED = '2020 published'
SWAP_MARK = ' †'


@dataclasses.dataclass
class Table:
  title: str
  header: list[str]
  rows: list[list[str]]
  notes: list[str] = dataclasses.field(default_factory=list)
  code: tuple[str, ...] = ()  # columns whose cells the Markdown shows as code (commands)

  def markdown(self) -> str:
    lines = [
      f'### {self.title}',
      '',
      '| ' + ' | '.join(self.header) + ' |',
      '|' + '|'.join('---' for _ in self.header) + '|',
    ]
    code = [h in self.code for h in self.header]
    lines += [
      '| ' + ' | '.join(f'`{c}`' if c and as_code else c for c, as_code in zip(r, code)) + ' |'
      for r in self.rows
    ]
    return '\n'.join(lines + [''] + [f'- {n}' for n in self.notes])

  def csv(self) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator='\n')
    writer.writerow(self.header)
    writer.writerows(self.rows)
    return buf.getvalue()


def fmt(value: float) -> str:
  """A throughput as people write it: 20,000 or 7.3, never 2e+04."""
  return f'{value:,.0f}' if value >= 100 else f'{value:.3g}'


@dataclasses.dataclass(frozen=True)
class Cell:
  """One figure: a number where there is one, and the text the table shows."""

  value: float | None
  text: str
  at_least: bool = False  # a lower bound: the search stopped at --max_examples


def source_label(record: dict[str, Any]) -> str:
  if record.get('mode') == 'predict':
    kind = 'predicted'
  else:
    kind = 'emulated' if (record.get('emulation') or {}).get('gpu') else 'measured'
  if (record.get('device') or {}).get('deviceless'):
    kind += ' (deviceless)'  # compiled for the GPU on a host without it: no autotuning
  if record.get('framework', 'jax') == 'pytorch':
    kind += ' PyTorch' + (' compiled' if record.get('torch_compile') else '')
  extra = ''.join(
    [
      ' tiny' if record.get('tiny') else '',
      ''.join(f' {k}={v}' for k, v in record.get('overrides') or []),
    ]
  )
  return f"{kind} {record['precision']}{extra}{earlier_revision(record)}"


def earlier_revision(record: dict[str, Any]) -> str:
  """', revision N' where the record ran or compiled an earlier revision of its workload than
  today's (a different program: docs/workloads.md says what changed), else ''."""
  try:
    today = registry.get(record.get('workload', '')).revision
  except KeyError:
    return ''
  rev = store.revision(record)
  return f', revision {rev}' if rev != today else ''


def has_earlier_revision(source: str) -> bool:
  return ', revision ' in source


def kind_of(source: str) -> str:
  """The kind of a source label: published, emulated, predicted (on the GPU), deviceless
  (predicted on a host without the GPU) or measured."""
  if source.startswith(PUBLISHED):
    return 'published'
  if source.startswith('predicted (deviceless)'):
    return 'deviceless'
  return next((k for k in ('predicted', 'emulated') if source.startswith(k)), 'measured')


def _batch_cell(r: dict[str, Any]) -> Cell:
  if r['status'] in ('ok', 'invalid'):
    bound = store.lower_bound(r)
    return Cell(float(r['max_batch']), f"{'≥' if bound else ''}{r['max_batch']}", at_least=bound)
  return Cell(None, 'OOM' if r['status'] == 'oom' else r['status'])


def _throughput_cell(r: dict[str, Any]) -> Cell:
  value = (r.get('measurement') or {}).get('units_per_s')
  if r['status'] == 'ok' and value is not None:
    return Cell(float(value), fmt(value))
  return Cell(None, 'OOM' if r['status'] == 'oom' else r['status'])


@dataclasses.dataclass
class Data:
  """Everything the tables and charts show: (workload, source) -> gpu -> Cell."""

  gpus: list[str]
  workloads: list[str]
  sources: dict[str, list[str]]  # workload -> sources, PUBLISHED first
  batch: dict[tuple[str, str], dict[str, Cell]]
  throughput: dict[tuple[str, str], dict[str, Cell]]
  records: list[dict[str, Any]]


def measured_gpu(record: dict[str, Any]) -> str | None:
  """The catalog card a run measured on its own GPU ran on (its device kind), or None."""
  return catalog.of_device((record.get('device') or {}).get('kind', ''))


def collect(records: list[dict[str, Any]], measured: list[dict[str, Any]] = ()) -> Data:
  """The latest result of each emulated or predicted cell, beside the published rows; and the
  `measured` runs (full-memory searches on the measuring GPU itself, chosen by the caller) in
  that GPU's column, as "measured" sources."""
  latest = [r for r in store.latest(records).values() if (r.get('emulation') or {}).get('gpu')]
  own = [(r, measured_gpu(r)) for r in measured]
  own = [(r, g) for r, g in own if g is not None]
  order = catalog.names()
  seen = {r['emulation']['gpu'] for r in latest} | {g for _, g in own}
  gpus = published.gpus() + [g for g in order if g in seen and g not in published.gpus()]
  gpus += sorted(seen - set(gpus))  # raw sizes (--memory_gb) after the catalog
  extra = sorted({r['workload'] for r in latest + [r for r, _ in own]} - set(published.workloads()))
  workloads = published.workloads() + extra
  batch: dict = {}
  tput: dict = {}
  for row in published.rows():
    text = 'OOM' if row.max_batch == 0 else str(row.max_batch)
    batch.setdefault((row.workload, PUBLISHED), {})[row.gpu] = Cell(
      float(row.max_batch) if row.max_batch else None, text
    )
    tput.setdefault((row.workload, PUBLISHED), {})[row.gpu] = Cell(
      row.throughput if row.max_batch else None,
      'OOM' if row.max_batch == 0 else fmt(row.throughput),
    )
  sources: dict[str, list[str]] = {
    w: [PUBLISHED] if (w, PUBLISHED) in batch else [] for w in workloads
  }
  for r in sorted(latest, key=lambda r: (r.get('mode') == 'predict', source_label(r))):
    src, w, gpu = source_label(r), r['workload'], r['emulation']['gpu']
    if src not in sources[w]:
      sources[w].append(src)
    batch.setdefault((w, src), {})[gpu] = _batch_cell(r)
    if r.get('mode') != 'predict':
      tput.setdefault((w, src), {})[gpu] = _throughput_cell(r)
  for r, gpu in own:
    src, w = source_label(r), r['workload']
    if src not in sources[w]:
      sources[w].append(src)
    batch.setdefault((w, src), {})[gpu] = _batch_cell(r)
    tput.setdefault((w, src), {})[gpu] = _throughput_cell(r)
  return Data(gpus, workloads, sources, batch, tput, latest)


def _ratio(a: Cell | None, b: Cell | None) -> str:
  if a is None or b is None:
    return ''
  if a.value is not None and b.value:
    return f"{'≥' if a.at_least else ''}{a.value / b.value:.2f}"
  if a.text == 'OOM' and b.text == 'OOM':
    return 'both OOM'
  return ''


def display(gpu: str) -> str:
  """A card's name as people write it; a raw size (--memory_gb, 'mem_133.6gb') as its card's."""
  try:
    return catalog.get(gpu).display
  except catalog.CatalogError:
    pass
  if gpu.startswith('mem_') and gpu.endswith('gb'):
    try:
      return catalog.raw(float(gpu[len('mem_') : -len('gb')])).display
    except (ValueError, catalog.CatalogError):
      pass
  return gpu


def metric_table(data: Data, grid: dict, title: str, unit_note: str) -> Table:
  header = ['workload', 'source'] + [display(g) for g in data.gpus]
  rows = []
  for w in data.workloads:
    for src in [s for s in data.sources[w] if (w, s) in grid]:
      mark = SWAP_MARK if src == PUBLISHED and w in published.SWAPPED else ''
      rows.append([w, src + mark] + [grid[(w, src)].get(g, Cell(None, '')).text for g in data.gpus])
    pub = grid.get((w, PUBLISHED), {})
    for src in [s for s in data.sources[w] if s != PUBLISHED and (w, s) in grid and pub]:
      ratios = [_ratio(grid[(w, src)].get(g), pub.get(g)) for g in data.gpus]
      if any(ratios):  # a source only on GPUs the 2020 benchmark did not have compares nothing
        rows.append([w, f'{src} / 2020'] + ratios)
  return Table(title, header, rows, [unit_note])


def normalized(data: Data, reference: str) -> dict[tuple[str, str], dict[str, float]]:
  """Throughput / the same row's throughput on the reference GPU, for rows with throughput on
  the reference and at least one other GPU (a row alone on the reference says nothing)."""
  out = {}
  for key, cells in data.throughput.items():
    ref = cells.get(reference)
    if ref is None or not ref.value:
      continue
    if sum(c.value is not None for c in cells.values()) < 2:
      continue
    out[key] = {g: c.value / ref.value for g, c in cells.items() if c.value is not None}
  return out


def summary(data: Data, reference: str) -> dict[str, dict[str, tuple[float, int]]]:
  """Source -> gpu -> (geometric mean over workloads of normalized throughput, workloads)."""
  logs: dict[str, dict[str, list[float]]] = {}
  for (w, src), by_gpu in normalized(data, reference).items():
    del w
    for g, v in by_gpu.items():
      if v > 0:
        logs.setdefault(src, {}).setdefault(g, []).append(math.log(v))
  return {
    src: {g: (math.exp(sum(v) / len(v)), len(v)) for g, v in by_gpu.items()}
    for src, by_gpu in logs.items()
  }


TIDY_HEADER = [
  'source',
  'kind',
  'workload',
  'precision',
  'gpu',
  'memory',
  'status',
  'max_batch',
  'unit',
  'units_per_s',
  'throughput_unit',
  'median_step_s',
  'spread_pct',
  'tflops_per_s',
  'device',
  'timestamp',
]


def status_of(r: dict[str, Any]) -> str:
  """ok, oom, lower_bound (a search stopped at --max_examples) or failed (anything else)."""
  if r.get('status') == 'ok':
    return 'lower_bound' if store.lower_bound(r) else 'ok'
  return 'oom' if r.get('status') == 'oom' else 'failed'


def tidy(data: Data, measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """One row per source, workload, precision and GPU (and memory, for measured runs), numbers as
  numbers: the published 2020 figures, the emulated and predicted cells (data), the measured
  runs (`measured`: measured.latest's rows). Empty where a figure does not apply."""
  rows = []
  for p in published.rows():
    rows.append(
      {
        'source': PUBLISHED,
        'kind': 'published',
        'workload': p.workload,
        'precision': p.precision,
        'gpu': p.gpu,
        'memory': f'{p.memory_gb:g} GB',
        'status': 'ok' if p.max_batch else 'oom',
        'max_batch': p.max_batch or None,
        'unit': p.batch_unit,
        'units_per_s': p.throughput if p.max_batch else None,
        'throughput_unit': p.throughput_unit,
      }
    )
  for r in data.records:
    rows.append(_tidy_record(r, source_label(r), r['emulation']['gpu']))
  for r in measured:
    rows.append(_tidy_record(r, f"measured {r['precision']}", None))
  return [{k: row.get(k) for k in TIDY_HEADER} for row in rows]


def _tidy_record(r: dict[str, Any], source: str, gpu: str | None) -> dict[str, Any]:
  m = r.get('measurement') or {}
  device = r.get('device') or {}
  status = status_of(r)
  limit = (r.get('memory') or {}).get('limit_bytes')
  return {
    'source': source,
    'kind': kind_of(source),
    'workload': r['workload'],
    'precision': r['precision'],
    'gpu': gpu or device.get('kind'),
    'memory': display(gpu) if gpu else ('full' if not limit else f'{limit / 1e9:g} GB'),
    'status': status,
    'max_batch': r.get('max_batch') if status in ('ok', 'lower_bound') else None,
    'unit': r.get('unit'),
    'units_per_s': m.get('units_per_s') if r.get('mode') != 'predict' else None,
    'throughput_unit': r.get('throughput_unit'),
    'median_step_s': m.get('median_step_s'),
    'spread_pct': m.get('spread_pct'),
    'tflops_per_s': m.get('tflops_per_s'),
    'device': device.get('kind') + (' (deviceless)' if device.get('deviceless') else '')
    if device.get('kind')
    else None,
    'timestamp': r.get('timestamp'),
  }


def tidy_csv(rows: list[dict[str, Any]]) -> str:
  """The tidy rows as CSV: numbers unformatted, None as an empty field."""
  buf = io.StringIO()
  writer = csv.DictWriter(buf, TIDY_HEADER, lineterminator='\n')
  writer.writeheader()
  for row in rows:
    writer.writerow({k: '' if v is None else v for k, v in row.items()})
  return buf.getvalue()
