"""The report from fixture results: 2020 layout, published figures beside ours, ratios, PNGs."""

import csv
import os
import shlex
import shutil
import subprocess
import sys

import matplotlib.image
import pytest

from jaxbench import report_main
from jaxbench.cards import catalog
from jaxbench.results import measured, published, render, side_by_side, tables
from jaxbench.results import records as report
from models import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _result(workload, gpu, max_batch, units_per_s=None, mode='run', status='ok', precision='fp32'):
  return {
    'schema': 'jaxbench.result/1',
    'mode': mode,
    'workload': workload,
    'workload_revision': registry.get(workload).revision,  # today's program
    'precision': precision,
    'tiny': False,
    'overrides': [],
    'emulation': {**catalog.get(gpu).emulation(), 'how': 'fixture'},
    'unit': 'sequences',
    'throughput_unit': 'sequences/s',
    'status': status,
    'max_batch': max_batch,
    'max_examples': max_batch,
    'measurement': None if units_per_s is None else {'units_per_s': units_per_s},
  }


FIXTURE = [
  _result('bert_base', 'rtx_2060', 8, 68.0),
  _result('bert_base', 'quadro_rtx_8000', 150, 188.0),
  _result('bert_base', 'rtx_2060', 10, mode='predict'),
  _result('bert_base', 'quadro_rtx_8000', 150, mode='predict'),
  _result('pix2pixhd', 'rtx_2080_ti', 0, status='oom'),
  _result('transformer_big', 'h200', 3000, 9000.0, precision='fp16'),
  _result('mt_dnn', 'rtx_2060', 0, status='failed'),
]


def _rows(table, workload):
  return {r[1]: r[2:] for r in table.rows if r[0] == workload}


def test_max_batch_table_sets_ours_beside_the_published_rows():
  data = tables.collect(FIXTURE)
  built = render.build_tables(data, 'quadro_rtx_8000')
  t = built['max_batch']
  assert t.header[2:10] == [g.display for g in catalog.lambda2020()] and t.header[10] == 'H200'
  bert = _rows(t, 'bert_base')
  assert list(bert) == [
    '2020 published',
    'emulated fp32',
    'predicted fp32',
    'emulated fp32 / 2020',
    'predicted fp32 / 2020',
  ]
  assert bert['2020 published'][0] == '8' and bert['2020 published'][7] == '128'
  assert bert['emulated fp32'][0] == '8' and bert['emulated fp32'][7] == '150'
  assert bert['emulated fp32 / 2020'][7] == '1.17' and bert['predicted fp32 / 2020'][0] == '1.25'
  pix = _rows(t, 'pix2pixhd')
  assert pix['emulated fp32'][4] == 'OOM' and pix['emulated fp32 / 2020'][4] == 'both OOM'
  assert _rows(t, 'mt_dnn')['emulated fp32'][0] == 'failed'
  assert _rows(t, 'transformer_big')['2020 published †'][7] == '16000'
  assert _rows(t, 'transformer_big')['emulated fp16'][8] == '3000'  # the H200 column
  notes = render.cards_notes(data)  # said once, above the 2020 cards' tables
  assert any(n.startswith('† The published') for n in notes)
  assert (
    'The published figures were measured in FP32 (yolov3: presumably, the original\'s code is '
    'unknown), except the figures under conv_seq2seq, which are transformer_big\'s, in FP16.'
  ) in notes
  assert any('768 MiB' in n for n in notes) and any('"N GB card"' in n for n in notes)
  assert not any('768 MiB' in n or 'swapped' in n for n in t.notes)  # not under each table
  assert '| bert_base | emulated fp32 | 8 |' in t.markdown()


def test_throughput_ratio_and_normalization():
  data = tables.collect(FIXTURE)
  built = render.build_tables(data, 'quadro_rtx_8000')
  bert = _rows(built['throughput'], 'bert_base')
  assert bert['2020 published'][0] == '34' and bert['emulated fp32'][0] == '68'
  assert bert['emulated fp32 / 2020'][0] == '2.00' and 'predicted fp32' not in bert
  norm = _rows(built['normalized'], 'bert_base')
  assert norm['2020 published'][0] == f'{34 / 94:.2f}' and norm['2020 published'][7] == '1.00'
  assert norm['emulated fp32'][0] == f'{68 / 188:.2f}'
  summ = tables.summary(data, 'quadro_rtx_8000')
  assert summ['emulated fp32']['rtx_2060'] == (pytest.approx(68 / 188), 1)
  assert summ['2020 published']['quadro_rtx_8000'] == (pytest.approx(1.0), 12)
  norm_t4 = render.build_tables(data, 'rtx_2060')['normalized']
  assert _rows(norm_t4, 'bert_base')['2020 published'][7] == f'{94 / 34:.2f}'


def test_prediction_error_is_measured_per_cell():
  t = render.prediction_table(tables.collect(FIXTURE).records)
  assert [r[2:] for r in t.rows] == [
    ['Quadro RTX 8000', 'on the GPU', '150', '150', '+0.0%'],
    ['RTX 2060', 'on the GPU', '10', '8', '+25.0%'],
  ]
  assert (
    t.notes[0]
    == 'Predicted on the GPU: 2 cells, mean absolute error 12.5%, 1 exact, 1 over-predicted'
  )


def _deviceless(workload, gpu, max_batch):
  r = _result(workload, gpu, max_batch, mode='predict')
  r['device'] = {'kind': 'NVIDIA H200', 'deviceless': True}
  return r


def test_a_deviceless_prediction_is_a_cell_of_its_own_with_its_own_error():
  records = FIXTURE + [_deviceless('bert_base', 'rtx_2060', 9)]
  data = tables.collect(records)
  t = render.build_tables(data, 'quadro_rtx_8000')['max_batch']
  rows = _rows(t, 'bert_base')
  assert rows['predicted fp32'][0] == '10'  # the on-device prediction is still shown
  assert rows['predicted (deviceless) fp32'][0] == '9'
  p = render.prediction_table(data.records)
  assert [r[2:] for r in p.rows] == [
    ['Quadro RTX 8000', 'on the GPU', '150', '150', '+0.0%'],
    ['RTX 2060', 'deviceless', '9', '8', '+12.5%'],
    ['RTX 2060', 'on the GPU', '10', '8', '+25.0%'],
  ]
  assert p.notes[0] == (
    'Predicted on the GPU: 2 cells, mean absolute error 12.5%, 1 exact, 1 over-predicted; '
    'Predicted deviceless: 1 cells, mean absolute error 12.5%, 0 exact, 1 over-predicted'
  )


def test_a_prediction_is_checked_against_a_run_of_the_same_revision_only():
  """A prediction of today's program beside an emulated run of an earlier revision is no error
  of the prediction: no row; an earlier revision's pair is a row that names the revision."""
  today = registry.get('bert_base').revision
  old_run, new_pred, old_pred = (
    _result('bert_base', 'rtx_2060', 8),
    _deviceless('bert_base', 'rtx_2060', 9),
    _result('bert_base', 'rtx_2060', 8, mode='predict'),
  )
  old_run['workload_revision'] = old_pred['workload_revision'] = today - 1
  new_pred['workload_revision'] = today
  p = render.prediction_table(tables.collect([old_run, new_pred]).records)
  assert p.rows == []
  p = render.prediction_table(tables.collect([old_run, new_pred, old_pred]).records)
  assert [r[1:] for r in p.rows] == [
    [f'fp32, revision {today - 1}', 'RTX 2060', 'on the GPU', '8', '8', '+0.0%']
  ]


def _trials(record, peaks, deviceless):
  record.update(
    jax_version='0.11.2',
    xla_flags='--xla_gpu_enable_triton_gemm=false',
    config={'resolution': 1024},
    device={'kind': 'NVIDIA H200', **({'deviceless': True} if deviceless else {})},
    search={'trials': [{'examples': n, 'predicted_peak_bytes': p} for n, p in peaks.items()]},
  )
  return record


def test_the_deviceless_forecast_gap_is_summarized_per_workload():
  full = _result('stylegan', 'h200', 82, 11.5)
  full['emulation'] = None  # a full-memory run on the H200: no card emulated
  records = FIXTURE + [
    _trials(full, {82: 141_000_000_000, 88: 149_000_000_000, 1: 3_220_000_000}, False),
    _trials(_deviceless('stylegan', 'rtx_2060', 2), {1: 3_020_000_000, 2: 4_500_000_000}, True),
    _trials(_deviceless('stylegan', 'h200', 88), {88: 142_000_000_000}, True),
  ]
  t = render.build_tables(tables.collect(records), 'quadro_rtx_8000', records)['forecast']
  assert t.rows == [['stylegan', 'fp32', '2', '-7,000 to -200', '-6.21% (at 1)']]
  assert 'autotuner' in t.notes[0]
  empty = render.build_tables(tables.collect(FIXTURE), 'quadro_rtx_8000')['forecast']
  assert empty.rows == [] and 'No batch was compiled both ways' in empty.notes[0]


def test_a_max_stopped_by_max_examples_shows_as_a_lower_bound_and_measures_no_error():
  capped = _result('bert_base', 'rtx_2080_ti', 8, 50.0)
  capped['search'] = {'capped': True}
  records = FIXTURE + [capped, _result('bert_base', 'rtx_2080_ti', 64, mode='predict')]
  t = render.build_tables(tables.collect(records), 'quadro_rtx_8000')['max_batch']
  assert _rows(t, 'bert_base')['emulated fp32'][4] == '≥8'
  assert _rows(t, 'bert_base')['emulated fp32 / 2020'][4] == '≥0.25'  # 2020: 32 sequences
  p = render.prediction_table(tables.collect(records).records)
  assert [r[2] for r in p.rows] == ['Quadro RTX 8000', 'RTX 2060']  # not the 2080 Ti pair
  assert p.notes[0].endswith('(1 left out: a search stopped at --max_examples, a lower bound only)')


def test_a_retried_cell_shows_its_latest_result():
  retried = FIXTURE + [_result('mt_dnn', 'rtx_2060', 1, 3.0)]
  t = render.build_tables(tables.collect(retried), 'quadro_rtx_8000')['max_batch']
  assert _rows(t, 'mt_dnn')['emulated fp32'][0] == '1'


def test_a_result_of_an_earlier_revision_is_a_row_that_names_it():
  w = registry.get('mask_rcnn')
  assert w.revision > 1
  old = {**_result('mask_rcnn', 'rtx_2060', 1, mode='predict'), 'workload_revision': 1}
  new = _result('mask_rcnn', 'titan_rtx', 9, mode='predict')
  data = tables.collect(FIXTURE + [old, new])
  rows = _rows(render.build_tables(data, 'quadro_rtx_8000')['max_batch'], 'mask_rcnn')
  assert rows['predicted fp32, revision 1'][0] == '1'
  assert rows['predicted fp32'][5] == '9'  # the Titan RTX column
  assert any(', revision N' in note for note in render.cards_notes(data))
  assert not any(', revision N' in note for note in render.cards_notes(tables.collect(FIXTURE)))


@pytest.mark.slow
def test_report_command_writes_markdown_csv_and_pngs_that_open(tmp_path):
  path = str(tmp_path / 's.jsonl')
  for r in FIXTURE:
    report.append_jsonl(path, r)
  out = str(tmp_path / 'out')
  paths = report_main.write(path, out, 'quadro_rtx_8000')
  names = sorted(os.path.basename(p) for p in paths)
  assert names == sorted(
    [
      'measured.csv',
      'measured_other.csv',
      'jax_pytorch.csv',
      'max_batch.csv',
      'throughput.csv',
      'normalized.csv',
      'summary.csv',
      'prediction.csv',
      'forecast.csv',
      'README.md',
      'results.csv',
      'fit_map.png',
      'max_batch.png',
      'throughput.png',
      'normalized.png',
    ]
  )
  for p in paths:
    if p.endswith('.png'):
      image = matplotlib.image.imread(p)
      assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0
  with open(os.path.join(out, 'max_batch.csv')) as f:
    rows = list(csv.reader(f))
  assert rows[0][:3] == ['workload', 'source', 'RTX 2060']
  assert ['bert_base', 'emulated fp32', '8'] == rows[
    [r[:2] for r in rows].index(['bert_base', 'emulated fp32'])
  ][:3]
  md = open(os.path.join(out, 'README.md')).read()
  assert '### Largest batch before OOM' in md and '![max_batch.png](max_batch.png)' in md
  assert 'mean absolute error 12.5%' in md


def test_report_reads_several_files_in_order(tmp_path):
  first, second = str(tmp_path / 'a.jsonl'), str(tmp_path / 'b.jsonl')
  for r in FIXTURE:
    report.append_jsonl(first, r)
  report.append_jsonl(second, _result('bert_base', 'rtx_2060', 9, 70.0))  # a rerun: it wins
  report.append_jsonl(second, _deviceless('bert_base', 'rtx_2060', 9))
  out = str(tmp_path / 'out')
  report_main.write([first, second], out, 'quadro_rtx_8000')
  with open(os.path.join(out, 'prediction.csv')) as f:
    rows = list(csv.reader(f))
  assert ['bert_base', 'fp32', 'RTX 2060', 'deviceless', '9', '9', '+0.0%'] in rows
  assert ['bert_base', 'fp32', 'RTX 2060', 'on the GPU', '10', '9', '+11.1%'] in rows
  md = open(os.path.join(out, 'README.md')).read()
  assert '[a.jsonl](../a.jsonl), [b.jsonl](../b.jsonl) (9 results)' in md.splitlines()[2]


def test_a_raw_memory_size_shows_as_its_card():
  assert tables.display('mem_133.6gb') == '133.6 GB card'
  assert tables.display('titan_rtx') == 'Titan RTX'
  assert tables.display('mem_nonsense') == 'mem_nonsense'


def _full_memory_run():
  """bert_base fp32 at the H200's full pool, as its result recorded it (search trials left out)."""
  return {
    **_result('bert_base', 'h200', 1176, 623.6256470311966),
    'emulation': None,
    'workload_revision': registry.get('bert_base').revision,
    'config': dict(registry.get('bert_base').config),
    'device': {'count': 1, 'kind': 'NVIDIA H200', 'platform': 'gpu', 'pool_bytes': 142606336000},
    'memory': {'limit_bytes': None, 'remat': False},
    'jax_version': '0.11.2',
    'timestamp': '2026-11-29T22:45:11+00:00',
    'xla_flags': '--xla_gpu_enable_triton_gemm=false --xla_disable_hlo_passes=rematerialization',
    'search': {'mode': 'search', 'trials': []},
    'measurement': {
      'units_per_s': 623.6256470311966,
      'median_step_s': 1.8857,
      'spread_pct': 0.22,
      'tflops_per_s': 43.6,
      'warmup_steps': 2,
      'steps_per_window': 2,
      'window_step_s': [1.8857] * 5,
    },
  }


def test_the_page_leads_with_the_measured_runs_and_ends_with_the_command_that_renders_it(
  tmp_path,
):
  path = str(tmp_path / 'h200.jsonl')
  for r in FIXTURE + [_full_memory_run()]:
    report.append_jsonl(path, r)
  out = str(tmp_path / 'page')
  render.write([path], out, 'rtx_2060')
  md = open(os.path.join(out, 'README.md')).read()
  assert md.index('## Measured runs') < md.index('## The 2020 cards') < md.index('### Largest')
  assert (
    '| bert_base | fp32 | full | 1,176 sequences | 623.6 sequences/s | 1,885.7 (±0.1%) | 43.6 '
    '| 2026-11-29 | 0.11.2 |  | `python -m jaxbench.main --model=bert_base --precision=fp32 '
    '--search_tolerance=0 --warmup_steps=2 --steps=10 --windows=5` |'  # an exact search
  ) in md
  assert '| bert_base | fp32 | RTX 2060 | 8 sequences | 68.0 sequences/s |' in md  # emulated
  assert 'Measured on NVIDIA H200 (142.6 GB pool at full memory) with JAX 0.11.2' in md
  assert md.rstrip().endswith(
    f'`python -m jaxbench.report_main --store={path} --out={out} --reference_gpu=rtx_2060`.'
  )
  with open(os.path.join(out, 'measured.csv')) as f:
    rows = list(csv.reader(f))
  assert rows[0] == measured.HEADER
  assert ['bert_base', 'fp32', 'full', '1,176 sequences'] in [r[:4] for r in rows]


def _csv(path) -> list[list[str]]:
  with open(path) as f:
    return list(csv.reader(f))


# The tables whose last columns follow today's workloads rather than the results (the form and
# the command; tests/test_measured.py and test_side_by_side.py check them), by title and CSV.
REGISTRY_COLUMNS = {
  measured.TITLE: ('measured.csv', 2),
  measured.OTHER_TITLE: ('measured_other.csv', 2),
  side_by_side.TITLE: ('jax_pytorch.csv', 1),
}


def _registry_free(page: str, docs) -> tuple[list[str], list[list[list[str]]]]:
  """The page and the CSVs of REGISTRY_COLUMNS' tables (in `docs`) without those columns."""
  lines = page.splitlines()
  for title, (_, n) in REGISTRY_COLUMNS.items():
    i = lines.index(f'### {title}') + 2
    while lines[i].startswith('|'):
      lines[i] = lines[i].rsplit(' | ', n)[0]
      i += 1
  csvs = [[r[:-n] for r in _csv(os.path.join(docs, f))] for f, n in REGISTRY_COLUMNS.values()]
  return lines, csvs


@pytest.mark.slow
def test_docs_results_is_what_its_own_command_renders(tmp_path):
  """docs/results/README.md names the command that renders it; run in a copy of the stores, the
  command writes the same page and CSV files."""
  docs = os.path.join(ROOT, 'docs', 'results')
  page = open(os.path.join(docs, 'README.md')).read()
  command = page.rstrip().splitlines()[-1].split('`')[1]
  argv = shlex.split(command)
  assert argv[:3] == ['python', '-m', 'jaxbench.report_main']
  copy = tmp_path / 'docs' / 'results'
  copy.mkdir(parents=True)
  for name in os.listdir(docs):
    if name.endswith('.jsonl'):
      shutil.copy(os.path.join(docs, name), copy / name)
  done = subprocess.run(
    [sys.executable, *argv[1:]],
    cwd=tmp_path,
    env={**os.environ, 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr
  partial = {f for f, _ in REGISTRY_COLUMNS.values()}
  for name in os.listdir(docs):
    if name.endswith('.csv') and name not in partial:
      assert (copy / name).read_text() == open(os.path.join(docs, name)).read(), name
  fresh = _registry_free((copy / 'README.md').read_text(), copy)
  assert fresh == _registry_free(page, docs), (
    f'docs/results is not what its results render: run {command}'
  )


def test_a_full_memory_search_on_the_gpu_itself_is_a_measured_source_in_its_column(tmp_path):
  own = {
    **_result('bert_base', 'rtx_2060', 1176, 623.6),
    'emulation': None,
    'device': {'platform': 'gpu', 'kind': 'NVIDIA H200', 'pool_bytes': 142606336000},
    'memory': {'limit_bytes': None},
    'search': {'mode': 'search', 'trials': []},
    'config': {},
    'throughput_unit': 'sequences/s',
    'measurement': {'units_per_s': 623.6, 'median_step_s': 1.8857, 'window_step_s': [1.8857]},
  }
  capped = {**own, 'memory': {'limit_bytes': 24_000_000_000}, 'max_batch': 187}
  path = str(tmp_path / 's.jsonl')
  for r in FIXTURE + [own, capped]:
    report.append_jsonl(path, r)
  out = str(tmp_path / 'out')
  report_main.write(path, out, 'quadro_rtx_8000')
  with open(os.path.join(out, 'max_batch.csv')) as f:
    rows = list(csv.reader(f))
  h200 = rows[0].index('H200')
  mine = [r for r in rows if r[:2] == ['bert_base', 'measured fp32']]
  assert [r[h200] for r in mine] == ['1176']  # the full pool's search, not the 24 GB cap's
  assert all(r[1] != 'measured fp32 / 2020' for r in rows)  # no 2020 figure on an H200


def test_each_published_figure_carries_the_precision_it_was_measured_in():
  """The swapped rows hold each other's figures: ConvS2S's FP32 under transformer_big,
  Transformer Big's FP16 under conv_seq2seq; the fit map still sets each workload's 2020
  precision beside its row (transformer_big fp16)."""
  rows = published.rows()
  by_name = {w: {r.precision for r in rows if r.workload == w} for w in published.workloads()}
  assert by_name['transformer_big'] == {'fp32'} and by_name['conv_seq2seq'] == {'fp16'}
  assert by_name['bert_base'] == {'fp32'} and by_name['yolov3'] == {'fp32?'}
  assert {r.figures_of for r in rows if r.workload == 'transformer_big'} == {'conv_seq2seq'}
  assert {r.figures_of for r in rows if r.workload == 'bert_base'} == {'bert_base'}
  trained = published.trained_precision()
  assert trained['transformer_big'] == 'fp16' and trained['conv_seq2seq'] == 'fp32'
  assert trained['mt_dnn'] == 'fp32' and len(trained) == 12
  tidy = tables.tidy(tables.collect(FIXTURE), [])
  pub = {(r['workload'], r['gpu']): r['precision'] for r in tidy if r['kind'] == 'published'}
  assert pub[('transformer_big', 'titan_rtx')] == 'fp32'
  assert pub[('conv_seq2seq', 'titan_rtx')] == 'fp16'
