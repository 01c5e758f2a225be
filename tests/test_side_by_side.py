"""JAX beside PyTorch on the results page (jaxbench.results.side_by_side): which runs pair, the
eager and compiled sides, the ratio over the better, max-batch searches, the page and its CSV."""

import csv
import os

from jaxbench.results import measured, records, render, side_by_side
from tests import test_measured
from tests.test_measured import toy  # noqa: F401 (a fixture: the toy workload in the registry)

FIXED = {'mode': 'fixed', 'trials': []}


def jax_run(units_per_s=1500.0, **changes):
  r = test_measured._run(framework='jax', **changes)
  r['measurement'] = {**r['measurement'], 'units_per_s': units_per_s, 'predicted_peak_bytes': 9e9}
  return r


def torch_run(units_per_s=1000.0, compile_s=None, **changes):
  r = test_measured._run(framework='pytorch', torch_version='2.11.0', torch_compile=False)
  del r['jax_version'], r['xla_flags']
  r['measurement'] = {
    **r['measurement'],
    'units_per_s': units_per_s,
    'compile_s': compile_s,
    'predicted_peak_bytes': None,
    'process_peak_bytes': 7e9,
  }
  r.update(changes)
  return r


def cells(t, i=0) -> dict[str, str]:
  return dict(zip(t.header, t.rows[i]))


def test_a_fixed_batch_pairs_only_with_a_pytorch_run_of_the_same_batch(toy):  # noqa: F811
  results = [
    jax_run(search=FIXED, max_batch=64),
    jax_run(search=FIXED, max_batch=128),  # no PyTorch run at 128
    jax_run(),  # a search, and no PyTorch search
    torch_run(1200.0, search=FIXED, max_batch=64),
    torch_run(900.0, search=FIXED, max_batch=32),  # no JAX run at 32
    torch_run(800.0, search=FIXED, max_batch=64, precision='fp32'),
    torch_run(800.0, search=FIXED, max_batch=64, memory={'limit_bytes': 24e9}),
  ]
  t = side_by_side.table(results)
  assert len(t.rows) == 1
  row = cells(t)
  assert row['batch'] == '64 images'
  assert (row['JAX'], row['PyTorch eager'], row['PyTorch compiled']) == (
    '1,500.0 images/s',
    '1,200.0 images/s',
    '-',
  )
  assert row['JAX / PyTorch'] == '1.25x'  # one PyTorch side: no name
  assert (row['GPU'], row['memory'], row['precision']) == ('NVIDIA H200', 'full', 'bf16')
  assert (row['peak memory JAX'], row['peak memory PyTorch']) == ('9.00 GB', '7.00 GB')
  assert row['form'] == ''  # the command runs the recorded program today


def test_a_jax_run_with_an_override_pairs_with_no_pytorch_run(toy):  # noqa: F811
  # A later JAX run of another program (a --set override) must not replace the JAX side of the
  # row its peer's run pairs with.
  results = [
    jax_run(1500.0, search=FIXED, max_batch=64, timestamp='2026-12-01T00:00:00+00:00'),
    jax_run(
      1300.0,
      search=FIXED,
      max_batch=64,
      overrides=[['resample', 'shifts']],
      config={**test_measured._run()['config'], 'resample': 'shifts'},
      timestamp='2026-12-02T00:00:00+00:00',
    ),
    torch_run(1200.0, search=FIXED, max_batch=64),
  ]
  t = side_by_side.table(results)
  assert len(t.rows) == 1
  assert cells(t)['JAX'] == '1,500.0 images/s'
  # A --set that names the default value runs the same program: it pairs, and being nearer the
  # PyTorch run in time (made by the same command), wins.
  named = jax_run(
    1400.0,
    search=FIXED,
    max_batch=64,
    overrides=[['resample', 'phases']],
    timestamp='2026-12-01T23:40:00+00:00',
  )
  assert cells(side_by_side.table([*results, named]))['JAX'] == '1,400.0 images/s'


def test_the_jax_side_is_the_run_nearest_in_time_to_the_pytorch_runs(toy):  # noqa: F811
  at = lambda day, hour: f'2026-12-0{day}T{hour:02d}:00:00+00:00'
  fixed = dict(search=FIXED, max_batch=64)
  results = [
    jax_run(1500.0, **fixed, timestamp=at(1, 10)),
    jax_run(1450.0, **fixed, timestamp=at(2, 12)),  # beside the PyTorch runs
    jax_run(1400.0, **fixed, timestamp=at(4, 9)),  # a later JAX run alone
    torch_run(1200.0, **fixed, timestamp=at(2, 12)),
    torch_run(1300.0, **fixed, timestamp=at(2, 13), torch_compile=True, compile_s=30.0),
  ]
  row = cells(side_by_side.table(results))
  assert row['JAX'] == '1,450.0 images/s' and row['date'] == '2026-12-02'


def test_a_jax_run_with_compiler_settings_of_its_own_pairs_with_no_pytorch_run(toy):  # noqa: F811
  plain = jax_run(1500.0, search=FIXED, max_batch=64, timestamp='2026-12-01T00:00:00+00:00')
  later = dict(search=FIXED, max_batch=64, timestamp='2026-12-02T00:00:00+00:00')
  triton = jax_run(1600.0, **later, xla_flags='--xla_disable_hlo_passes=rematerialization')
  rbg = jax_run(1700.0, **later, prng_impl='rbg')
  t = side_by_side.table([plain, triton, rbg, torch_run(1200.0, search=FIXED, max_batch=64)])
  assert len(t.rows) == 1 and cells(t)['JAX'] == '1,500.0 images/s'


def test_a_jax_run_of_an_earlier_revision_says_so(toy):  # noqa: F811
  results = [
    jax_run(search=FIXED, max_batch=64, workload_revision=1),
    torch_run(1200.0, search=FIXED, max_batch=64),
  ]
  assert cells(side_by_side.table(results))['form'] == 'earlier form: revision 1'


def test_eager_and_compiled_are_both_shown_and_the_ratio_is_over_the_better(toy):  # noqa: F811
  results = [
    jax_run(search=FIXED, max_batch=64),
    torch_run(1400.0, search=FIXED, max_batch=64, timestamp='2026-11-30T00:00:00+00:00'),
    torch_run(1000.0, search=FIXED, max_batch=64, timestamp='2026-12-02T00:00:00+00:00'),
    torch_run(1200.0, 42.04, search=FIXED, max_batch=64, torch_compile=True),
  ]
  row = cells(side_by_side.table(results))
  # The latest run of each side: the later eager run replaces the earlier, not the compiled one.
  assert row['PyTorch eager'] == '1,000.0 images/s'
  assert row['PyTorch compiled'] == '1,200.0 images/s (compile 42.0 s)'
  assert row['JAX / PyTorch'] == '1.25x over compiled'
  assert row['peak memory PyTorch'] == '7.00 GB eager, 7.00 GB compiled'
  assert row['date'] == '2026-12-01 to 2026-12-02'
  jax_cmd, eager_cmd, compiled_cmd = row['commands'].split('; ')
  assert '--framework' not in jax_cmd and '--batch_size=64' in jax_cmd
  assert eager_cmd.endswith(jax_cmd.split('--precision=bf16')[1])
  assert '--framework=pytorch --batch_size=64' in eager_cmd
  assert '--framework=pytorch --torch_compile --batch_size=64' in compiled_cmd
  slower = torch_run(1300.0, 40.0, search=FIXED, max_batch=64, torch_compile=True)
  assert cells(side_by_side.table(results[:2] + [slower]))['JAX / PyTorch'] == '1.07x over eager'


def test_a_search_pair_shows_both_max_batches_and_their_ratio(toy):  # noqa: F811
  fixed = torch_run(search=FIXED, max_batch=164)  # a fixed batch pairs with no search
  eager = torch_run(67.0, max_batch=82, max_examples=82)
  t = side_by_side.table([jax_run(134.0), fixed, eager])
  assert len(t.rows) == 1
  assert cells(t)['batch'] == 'max 164 / 82 images, 2.00x'
  assert cells(t)['JAX / PyTorch'] == '2.00x'
  compiled = torch_run(100.0, 30.0, max_batch=100, max_examples=100, torch_compile=True)
  both = cells(side_by_side.table([jax_run(134.0), eager, compiled]))
  assert both['batch'] == 'max 164 / 82 eager / 100 compiled images, 1.64x'
  assert both['JAX / PyTorch'] == '1.34x over compiled'


def test_each_fixed_batch_row_says_whether_jax_is_at_the_goal_or_how_far_short(toy):  # noqa: F811
  def row(jax, eager, compiled=None, **batch):
    batch = batch or {'search': FIXED, 'max_batch': 64}
    runs = [jax_run(jax, **batch), torch_run(eager, **batch)]
    if compiled is not None:
      runs.append(torch_run(compiled, 40.0, torch_compile=True, **batch))
    return cells(side_by_side.table(runs))['against 1.15x']

  assert row(1150.0, 1000.0, 900.0) == 'met'  # 1.15x the better side exactly
  assert row(1150.0, 900.0, 1000.0) == 'met'
  assert row(1030.0, 900.0, 1000.0) == 'short: JAX needs +12%'  # 1.03x: 1.15 / 1.03 = 1.117
  assert row(970.0, 1000.0, 900.0) == 'short: JAX needs +19%'  # 0.97x of eager, the better
  assert row(1500.0, 1000.0) == 'met, compiled not run'
  assert row(1100.0, 1000.0) == 'short: JAX needs +5%, compiled not run'
  # Max-batch searches ran their sides at different batches: no goal.
  assert row(1500.0, 1000.0, max_batch=82, max_examples=82) == '-'


def test_rows_follow_the_2020_workload_order_then_precision():
  def run(workload, precision, framework):
    make = jax_run if framework == 'jax' else torch_run
    return make(workload=workload, precision=precision, search=FIXED, max_batch=64)

  results = [
    run(w, p, f)
    for w in ('bert_base', 'transformer_big')
    for p in ('bf16', 'tf32')
    for f in ('pytorch', 'jax')
  ]
  t = side_by_side.table(results)
  assert [(r[0], r[1]) for r in t.rows] == [
    ('transformer_big', 'tf32'),
    ('transformer_big', 'bf16'),
    ('bert_base', 'tf32'),
    ('bert_base', 'bf16'),
  ]


def test_pytorch_runs_are_no_rows_of_the_jax_tables(toy):  # noqa: F811
  results = [jax_run(), torch_run(max_batch=82), torch_run(search=FIXED, max_batch=8)]
  main, other = measured.table(results), measured.others(results)
  assert len(main.rows) == 1 and other.rows == []
  assert not any('PyTorch' in h for h in main.header + other.header)
  assert len(main.header) == len(main.rows[0]) == len(measured.HEADER)
  assert measured.measured_on(results).endswith(': 1 run.')
  alone = side_by_side.table([torch_run(), torch_run(torch_compile=True)])
  assert alone.rows == [] and alone.notes[0] == side_by_side.EMPTY


def test_the_page_has_a_section_and_a_csv_of_jax_beside_pytorch(toy, tmp_path):  # noqa: F811
  path = str(tmp_path / 'frameworks.jsonl')
  for r in (jax_run(search=FIXED, max_batch=64), torch_run(1200.0, search=FIXED, max_batch=64)):
    records.append_jsonl(path, r)
  out = str(tmp_path / 'page')
  paths = render.write([path], out, 'quadro_rtx_8000')
  csv_path = os.path.join(out, 'jax_pytorch.csv')
  assert csv_path in paths
  with open(csv_path) as f:
    rows = list(csv.reader(f))
  assert rows[0] == side_by_side.HEADER and len(rows) == 2
  assert rows[1][:9] == [
    'toy',
    'bf16',
    'NVIDIA H200',
    'full',
    '64 images',
    '1,500.0 images/s',
    '1,200.0 images/s',
    '-',
    '1.25x',
  ]
  md = open(os.path.join(out, 'README.md')).read()
  assert md.index('## Measured runs') < md.index('## JAX beside PyTorch') < md.index('## The 2020')
  section = md[md.index('## JAX beside PyTorch') : md.index('## The 2020')]
  assert f'### {side_by_side.TITLE}' in section
  assert '| toy | bf16 | NVIDIA H200 | full | 64 images | 1,500.0 images/s |' in section
  assert '`python -m jaxbench.main --model=toy --precision=bf16 --batch_size=64' in section
  assert all(f'- {n}' in section for n in side_by_side.NOTES)
