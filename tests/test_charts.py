"""The report's charts and its tidy CSV: a colour per source everywhere, one legend entry per
source, labelled axes, OOM and lower bounds marked; numbers as numbers."""

import csv
import math
import os

import matplotlib.image
from matplotlib import colors as mcolors

from jaxbench.results import charts, render, tables
from tests import test_report_tables as fixture


def _records():
  capped = fixture._result('bert_base', 'rtx_2080_ti', 8, 50.0)
  capped['search'] = {'capped': True}
  fp16 = fixture._result('bert_base', 'rtx_2060', 20, 90.0, precision='fp16')
  return fixture.FIXTURE + [capped, fp16]


def _bars(fig) -> dict[str, set[str]]:
  """source -> the colours its bars have, over every panel of the figure."""
  out: dict[str, set[str]] = {}
  for ax in fig.axes:
    for container in ax.containers:
      for bar in container.patches:
        out.setdefault(container.get_label(), set()).add(mcolors.to_hex(bar.get_facecolor()))
  return out


def test_each_source_has_one_colour_and_one_legend_entry():
  data = tables.collect(_records())
  fig = charts.max_batch(data)
  bars = _bars(fig)
  assert {'2020 published', 'emulated fp32', 'emulated fp16', 'predicted fp32'} <= set(bars)
  for source, seen in bars.items():
    assert seen == {charts.colour(source)}, source  # one colour in every panel
  (legend,) = fig.legends
  labels = [t.get_text() for t in legend.get_texts()]
  assert sorted(labels) == sorted(bars)  # one entry per source, none missing
  for handle, label in zip(legend.legend_handles, labels):
    assert mcolors.to_hex(handle.get_facecolor()) == charts.colour(label)
  assert charts.colour('emulated fp32') != charts.colour('emulated fp16')
  assert charts.colour('predicted fp32') != charts.colour('predicted (deviceless) fp32')
  # The title sits above the legend.
  renderer = fig.canvas.get_renderer()
  assert fig._suptitle.get_window_extent(renderer).y0 >= legend.get_window_extent(renderer).y1


def test_axes_are_labelled_with_units_and_oom_is_marked():
  data = tables.collect(_records())
  fig = charts.max_batch(data)
  panels = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
  bert = panels['bert_base']
  assert bert.get_xlabel() == 'GPU' and bert.get_ylabel() == 'max batch (sequences, log scale)'
  pix = panels['pix2pixhd']
  oom = [t for t in pix.texts if t.get_text() == charts.OOM_TEXT]
  # The published OOMs and the emulated one on the RTX 2080 Ti, each in its source's colour.
  assert charts.colour('emulated fp32') in {mcolors.to_hex(t.get_color()) for t in oom}
  assert len(oom) >= 6
  # The capped search is a lower bound: hatched, with its ≥.
  hatched = [b for c in bert.containers for b in c.patches if b.get_hatch()]
  assert len(hatched) == 1 and '≥' in [t.get_text() for t in bert.texts]
  tput = charts.throughput(data)
  assert any('throughput (sequences/s)' == ax.get_ylabel() for ax in tput.axes)
  (legend,) = tput.legends
  assert "emulated fp32: the measuring GPU's speed at the card's max batch" in [
    t.get_text() for t in legend.get_texts()
  ]


def test_normalized_leaves_out_a_source_alone_on_the_reference():
  alone = fixture._result('yolov3', 'quadro_rtx_8000', 60, 80.0)
  data = tables.collect(_records() + [alone])
  norm = tables.normalized(data, 'quadro_rtx_8000')
  assert ('yolov3', 'emulated fp32') not in norm  # one GPU: a self-normalized 1.00 says nothing
  assert ('bert_base', 'emulated fp32') in norm
  fig = charts.normalized(data, 'quadro_rtx_8000')
  yolo = next(ax for ax in fig.axes if ax.get_title() == 'yolov3')
  assert set(_bars_of(yolo)) == {'2020 published'}


def _bars_of(ax) -> list[str]:
  return [c.get_label() for c in ax.containers]


def test_report_writes_charts_that_open_and_a_tidy_csv(tmp_path):
  path = tmp_path / 's.jsonl'
  for r in _records():
    fixture.report.append_jsonl(str(path), r)
  out = tmp_path / 'out'
  paths = render.write([str(path)], str(out), 'quadro_rtx_8000')
  pngs = [p for p in paths if p.endswith('.png')]
  assert sorted(os.path.basename(p) for p in pngs) == [
    'fit_map.png',
    'max_batch.png',
    'normalized.png',
    'throughput.png',
  ]
  for p in pngs:
    image = matplotlib.image.imread(p)
    assert image.ndim == 3 and image.shape[0] > 300 and image.std() > 0
  with open(out / 'results.csv') as f:
    rows = list(csv.DictReader(f))
  assert rows and set(rows[0]) == set(tables.TIDY_HEADER)
  for row in rows:
    assert row['status'] in ('ok', 'oom', 'lower_bound', 'failed')
    for key in ('max_batch', 'units_per_s', 'median_step_s', 'spread_pct', 'tflops_per_s'):
      if row[key]:
        assert math.isfinite(float(row[key])), (key, row[key])  # a number, never '280,386'
  by = {(r['source'], r['workload'], r['gpu']): r for r in rows}
  assert by[('emulated fp32', 'pix2pixhd', 'rtx_2080_ti')]['status'] == 'oom'
  assert by[('emulated fp32', 'pix2pixhd', 'rtx_2080_ti')]['max_batch'] == ''
  assert by[('emulated fp32', 'mt_dnn', 'rtx_2060')]['status'] == 'failed'
  capped = by[('emulated fp32', 'bert_base', 'rtx_2080_ti')]
  assert capped['status'] == 'lower_bound' and float(capped['max_batch']) == 8
  assert float(by[('emulated fp16', 'bert_base', 'rtx_2060')]['units_per_s']) == 90.0
  assert by[('2020 published', 'pix2pixhd', 'rtx_2060')]['status'] == 'oom'
  assert float(by[('2020 published', 'bert_base', 'rtx_2060')]['max_batch']) == 8
