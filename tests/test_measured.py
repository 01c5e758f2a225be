"""The measured-runs table (jaxbench.results.measured): a row per program, batch and memory, the
command that reproduces each run and the label of a run whose program today's workload no longer
runs (jaxbench.results.commands)."""

import dataclasses
import json
import os
import shlex

import pytest
from absl import flags

from jaxbench import cli
from jaxbench import main as entry  # defines every flag the commands give
from jaxbench.cards import emulation
from jaxbench.results import commands, measured, records, store
from models import registry
from models import workload as wl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEPT = [
  os.path.join(ROOT, 'docs', 'results', n)
  for n in ('h200.jsonl', 'deviceless.jsonl', 'frameworks.jsonl', 'h100.jsonl')
]
FLAGS = flags.FLAGS


@dataclasses.dataclass
class Toy:
  """A workload as the label and the command see it: its revision, config and choices."""

  name: str = 'toy'
  revision: int = 2
  config: dict = dataclasses.field(
    default_factory=lambda: {'width': 64, 'resample': 'phases', 'lr': 0.001}
  )
  tiny: dict = dataclasses.field(default_factory=lambda: {'width': 8})
  spec: dict = dataclasses.field(
    default_factory=lambda: {'resample': wl.Key(choices=('phases', 'shifts'))}
  )
  check = staticmethod(lambda cfg: None)
  resolve = wl.Workload.resolve


@pytest.fixture
def toy(monkeypatch):
  real = registry.get
  workload = Toy()
  monkeypatch.setattr(registry, 'get', lambda n: workload if n == 'toy' else real(n))
  return workload


def _run(**changes):
  r = {
    'schema': 'jaxbench.result/1',
    'mode': 'run',
    'workload': 'toy',
    'workload_revision': 2,
    'precision': 'bf16',
    'tiny': False,
    'overrides': [],
    'config': {'width': 64, 'resample': 'phases', 'lr': 0.001},
    'device': {'platform': 'gpu', 'kind': 'NVIDIA H200', 'pool_bytes': 142606336000},
    'emulation': None,
    'memory': {'limit_bytes': None, 'remat': False},
    'status': 'ok',
    'unit': 'images',
    'throughput_unit': 'images/s',
    'max_batch': 164,
    'max_examples': 164,
    'jax_version': '0.11.2',
    'timestamp': '2026-12-01T23:41:00+00:00',
    'xla_flags': '--xla_gpu_enable_triton_gemm=false --xla_disable_hlo_passes=rematerialization',
    'search': {'mode': 'search', 'tolerance': cli.SEARCH_TOLERANCE, 'trials': [{'examples': 164}]},
    'measurement': {
      'units_per_s': 67.66851,
      'median_step_s': 2.4236,
      'spread_pct': 0.4,
      'tflops_per_s': 65.43,
      'warmup_steps': 1,
      'steps_per_window': 1,
      'window_step_s': [2.42, 2.43, 2.42, 2.43, 2.42],
    },
  }
  r.update(changes)
  return r


def test_a_run_of_todays_program_has_no_label_and_a_command_without_sets(toy):
  r = _run()
  assert commands.earlier_form(r) is None
  assert commands.command_of(r) == (
    'python -m jaxbench.main --model=toy --precision=bf16 --warmup_steps=1 --steps=5 --windows=5'
  )
  exact = _run(search={'mode': 'search', 'tolerance': 0.0, 'trials': [{'examples': 164}]})
  assert '--precision=bf16 --search_tolerance=0 --warmup' in commands.command_of(exact)


def test_a_fixed_batch_that_did_not_finish_gets_the_batch_it_was_asked_for(toy):
  trial = {'batch': 8, 'examples': 8, 'outcome': 'unfinished'}
  r = _run(status='interrupted', max_batch=0, max_examples=0, measurement=None)
  r['search'] = {'mode': 'fixed', 'trials': [trial]}
  assert commands.command_of(r).endswith('--precision=bf16 --batch_size=8')
  r['parallel'] = {'global_devices': 2, 'local_devices': 2}
  assert commands.command_of(r).endswith('--devices=2 --batch_size=16')


def test_a_run_under_another_prng_gets_the_variable_that_chose_it(toy):
  assert commands.command_of(_run(prng_impl='threefry2x32')) == commands.command_of(_run())
  command = commands.command_of(_run(prng_impl='unsafe_rbg'))
  assert command.startswith('JAX_DEFAULT_PRNG_IMPL=unsafe_rbg python -m jaxbench.main --model=toy')


def test_a_run_with_xla_flags_of_its_own_gets_them_and_not_jaxbenchs(toy):
  own = '--xla_gpu_enable_triton_gemm=false --xla_disable_hlo_passes=rematerialization'
  assert commands.command_of(_run(xla_flags=own)) == commands.command_of(_run())
  command = commands.command_of(_run(xla_flags='--xla_gpu_enable_cublaslt=true ' + own))
  assert command.startswith("XLA_FLAGS='--xla_gpu_enable_cublaslt=true' python -m jaxbench.main")
  assert '--triton_gemm' not in command and '--remat' not in command


def test_an_earlier_revision_is_labelled_by_its_revision(toy):
  assert commands.earlier_form(_run(workload_revision=1)) == 'earlier form: revision 1'
  old = _run()
  del old['workload_revision']  # results from before revisions were revision 1
  assert commands.earlier_form(old) == 'earlier form: revision 1'


def test_a_key_today_lacks_is_named_and_left_out_of_the_command(toy):
  r = _run(
    workload_revision=1,
    overrides=[['fused_impl', 'phases'], ['resample', 'shifts']],
    config={'width': 64, 'resample': 'shifts', 'lr': 0.001, 'fused_impl': 'phases'},
  )
  assert commands.earlier_form(r) == 'earlier form: revision 1; fused_impl=phases'
  assert '--set=resample=shifts' in commands.command_of(r)
  assert 'fused_impl' not in commands.command_of(r)


def test_a_value_today_rejects_is_named_and_left_out_of_the_command(toy):
  r = _run(overrides=[['resample', 'dilated']], config={**_run()['config'], 'resample': 'dilated'})
  assert commands.earlier_form(r) == 'earlier form: resample=dilated'
  assert '--set' not in commands.command_of(r)


def test_a_config_from_before_a_default_changed_is_set_in_the_command(toy):
  """A run under another default of the time: today's workload runs it with --set, no label."""
  r = _run(config={'width': 64, 'resample': 'shifts', 'lr': 0.0005})
  assert commands.earlier_form(r) is None
  assert ' --set=lr=0.0005 --set=resample=shifts ' in commands.command_of(r)


def test_a_key_added_since_a_run_is_left_at_todays_default(toy):
  # A key that adds a choice keeps the program the run had; one that changes the default
  # program raises the revision, which labels the run.
  r = _run(config={'width': 64, 'lr': 0.001})  # recorded before `resample` existed
  assert '--set=resample' not in commands.command_of(r)
  assert commands.earlier_form(r) is None
  assert commands.earlier_form({**r, 'workload_revision': 1}) == 'earlier form: revision 1'


def test_a_workload_that_is_gone_is_labelled():
  assert commands.earlier_form(_run(workload='resnet_9000')) == (
    'earlier form: resnet_9000 is not a workload today'
  )


def test_the_command_carries_memory_batch_search_and_compiler_settings(toy):
  capped = _run(
    memory={'limit_bytes': 24_000_000_000, 'remat': True},
    search={
      'mode': 'search',
      'tolerance': 0.01,
      'capped': True,
      'run_every_fit': False,
      'trials': [{'examples': 1, 'autotune_level': 0}, {'examples': 2, 'autotune_level': None}],
    },
    xla_flags='--xla_gpu_autotune_level=0 --xla_disable_hlo_passes=rematerialization',
  )
  assert commands.command_of(capped) == (
    'python -m jaxbench.main --model=toy --precision=bf16 --memory_limit_gb=24 --remat '
    '--max_examples=164 --search_tolerance=0.01 --probe_autotune_level=0 --norun_every_fit '
    '--autotune_level=0 --triton_gemm --warmup_steps=1 --steps=5 --windows=5'
  )
  card = _run(
    tiny=True,
    config={**_run()['config'], 'width': 8},  # the tiny preset's
    emulation={'gpu': 'titan_rtx', 'memory_gb': 24.0},
    memory={'limit_bytes': 24964497408, 'remat': False},
    search={'mode': 'fixed', 'trials': []},
    max_batch=8,
  )
  assert commands.command_of(card).startswith(
    'python -m jaxbench.main --model=toy --precision=bf16 --tiny --gpu=titan_rtx --batch_size=8 '
  )
  raw = _run(emulation={'gpu': 'mem_22.9gb', 'memory_gb': 22.9}, measurement=None, mode='predict')
  raw['device'] = {'kind': 'NVIDIA H200', 'deviceless': True}
  assert commands.command_of(raw) == (
    'python -m jaxbench.main --model=toy --precision=bf16 --memory_gb=22.9 --predict '
    '--compile_for=h200'
  )


def _parse(command: str):
  argv = shlex.split(command)
  while argv and argv[0].startswith(('XLA_FLAGS=', 'JAX_DEFAULT_PRNG_IMPL=')):
    argv = argv[1:]  # the environment the run had beside jaxbench's flags
  assert argv[:3] == ['python', '-m', 'jaxbench.main']
  FLAGS.unparse_flags()
  FLAGS(['jaxbench.main', *argv[3:]])
  args = entry.read_args()
  return args, emulation.request(args), cli.plan(args)


def test_each_kept_results_command_parses_to_what_its_run_did():
  """Every command of docs/results is a valid command line whose plan is the recorded run: the
  workload, precision, memory, batch, timing, search and autotuning, and (unless the label says
  the program is an earlier form) the recorded configuration."""
  kept = [r for path in KEPT for r in store.read(path)[0]]
  assert sum(map(measured.is_measured, kept)) > 40
  try:
    for r in kept:
      args, req, plan = _parse(commands.command_of(r))
      o, m, s = plan.options, r.get('measurement') or {}, r.get('search') or {}
      assert [w.name for w in plan.workloads] == [r['workload']]
      assert (o.precision, o.tiny) == (r['precision'], r['tiny'])
      predict = r['mode'] == 'predict'
      assert req.kind == (emulation.PREDICT if predict else emulation.SINGLE)
      assert (req.target is not None) == bool(r['device'].get('deviceless'))
      if r.get('emulation'):
        assert [g.name for g in req.gpus] == [r['emulation']['gpu']]
        if not predict:
          assert req.limit_gb * 1e9 == pytest.approx(r['memory']['limit_bytes'], abs=1)
      else:
        limit = r['memory']['limit_bytes']
        assert args.memory_limit_gb == (None if limit is None else pytest.approx(limit / 1e9))
      fixed = s['mode'] == 'fixed'
      asked = s['trials'][0]['batch'] if fixed else None  # kept by a run that did not finish
      assert o.batch_size == asked
      if fixed and r['status'] == 'ok':
        assert asked == r['max_batch']
      if not fixed:
        assert o.search_tolerance == (s.get('tolerance') or 0.0)
      assert args.autotune_level == records.autotune_level(r)
      if m:
        windows = len(m['window_step_s'])
        assert (o.warmup_steps, o.windows) == (m['warmup_steps'], windows)
        assert o.steps == m['steps_per_window'] * windows
      if commands.earlier_form(r) is None:
        config = registry.get(r['workload']).resolve(o.tiny, dict(o.overrides))
        recorded = r.get('config')
        assert json.loads(json.dumps({k: config[k] for k in recorded})) == recorded, r['workload']
  finally:
    FLAGS.unparse_flags()


def test_the_latest_run_of_a_row_wins_and_rows_keep_the_tables_order(toy):
  search = _run(timestamp='2026-11-30T00:00:00+00:00', max_batch=100)
  rerun = _run(timestamp='2026-12-01T00:00:00+00:00')
  fixed = _run(search={'mode': 'fixed', 'trials': []}, max_batch=8)
  capped = _run(memory={'limit_bytes': 24_000_000_000}, search={'mode': 'search', 'capped': True})
  card = _run(
    emulation={'gpu': 'titan_rtx', 'memory_gb': 24.0}, memory={'limit_bytes': 24964497408}
  )
  fp32 = _run(precision='fp32', search={'mode': 'search', 'tolerance': 0.01}, max_batch=82)
  other = _run(config={**_run()['config'], 'resample': 'shifts'}, max_batch=150)
  failed = _run(status='interrupted', timestamp='2026-12-02T00:00:00+00:00')
  predicted = _run(mode='predict', measurement=None, timestamp='2026-12-02T00:00:00+00:00')
  runs = [search, card, fixed, capped, rerun, fp32, other, failed, predicted]
  t, rest = measured.table(runs), measured.others(runs)
  # One row per workload, precision and memory: the search of today's default configuration.
  assert [(r[1], r[2], r[3]) for r in t.rows] == [
    ('fp32', 'full', '82 images (within 1%)'),
    ('bf16', 'full', '164 images'),
    ('bf16', '24 GB', '≥164 images'),
    ('bf16', 'Titan RTX', '164 images'),
  ]
  assert t.rows[1][4:9] == ['67.7 images/s', '2,423.6 (±0.2%)', '65.4', '2026-12-01', '0.11.2']
  # Every other measured run: another config is another program, a fixed batch another batch.
  assert [(r[1], r[2], r[3]) for r in rest.rows] == [
    ('bf16', 'full', '150 images'),
    ('bf16', 'full', 'fixed 8 images'),
  ]
  assert rest.rows[0][9] == '' and '--set=resample=shifts' in rest.rows[0][10]
  # Where no search ran, a fixed batch speaks for its workload, precision and memory.
  alone = _run(precision='fp16', search={'mode': 'fixed', 'trials': []}, max_batch=8)
  assert [(r[1], r[3]) for r in measured.table([alone, search]).rows] == [
    ('bf16', '100 images'),
    ('fp16', 'fixed 8 images'),
  ]
  assert '| `python -m jaxbench.main --model=toy --precision=fp32 ' in t.markdown()
  assert (
    t.csv()
    .splitlines()[1]
    .endswith(
      ',python -m jaxbench.main --model=toy --precision=fp32 '
      '--search_tolerance=0.01 --warmup_steps=1 --steps=5 --windows=5'
    )
  )


def test_the_default_configuration_speaks_even_when_a_set_names_it(toy):
  fixed = {'search': {'mode': 'fixed', 'trials': []}, 'max_batch': 32}
  named_default = _run(**fixed, overrides=[['resample', 'phases']])
  other = _run(
    **fixed,
    overrides=[['resample', 'shifts']],
    config={**_run()['config'], 'resample': 'shifts'},
    timestamp='2026-12-02T00:00:00+00:00',  # later, yet not today's default program
  )
  assert commands.default_config(named_default) and not commands.default_config(other)
  t, rest = measured.table([named_default, other]), measured.others([named_default, other])
  assert '--set=resample=phases' in t.rows[0][10]
  assert [r[10] for r in rest.rows] == [commands.command_of(other)]


def test_a_later_run_with_other_compiler_settings_keeps_its_own_row_and_does_not_speak(toy):
  fixed = {'search': {'mode': 'fixed', 'trials': []}, 'max_batch': 32}
  plain = _run(**fixed)
  own = '--xla_gpu_enable_triton_gemm=false --xla_disable_hlo_passes=rematerialization'
  later = dict(fixed, timestamp='2026-12-02T00:00:00+00:00')
  triton = _run(**later, xla_flags='--xla_disable_hlo_passes=rematerialization')
  cublaslt = _run(**later, xla_flags='--xla_gpu_enable_cublaslt=true ' + own)
  rbg = _run(**later, prng_impl='rbg')
  assert records.compiler(plain) == '' and records.compiler(triton) == '--triton_gemm'
  assert records.compiler(cublaslt) == "XLA_FLAGS='--xla_gpu_enable_cublaslt=true'"
  assert records.compiler(rbg) == 'JAX_DEFAULT_PRNG_IMPL=rbg'
  results = [plain, triton, cublaslt, rbg]
  t, rest = measured.table(results), measured.others(results)
  assert [r[10] for r in t.rows] == [commands.command_of(plain)]
  assert sorted(r[10] for r in rest.rows) == sorted(map(commands.command_of, results[1:]))


def test_one_example_is_singular_and_figures_keep_their_digits(toy):
  t = measured.table(
    [_run(max_batch=1, measurement={**_run()['measurement'], 'units_per_s': 1.66})]
  )
  assert t.rows[0][3:5] == ['1 image', '1.66 images/s']
  assert [measured.figure(v) for v in (287537.37, 2763.86, 11.504, 1.0999)] == [
    '287,537',
    '2,763.9',
    '11.5',
    '1.10',
  ]


def test_the_measured_on_line_names_gpus_jax_and_dates(toy):
  line = measured.measured_on(
    [_run(), _run(precision='fp32', timestamp='2026-11-29T22:45:00+00:00', jax_version='0.10.2')]
  )
  assert line == (
    'Measured on NVIDIA H200 (142.6 GB pool at full memory) with JAX 0.10.2, 0.11.2, '
    '2026-11-29 to 2026-12-01: 2 runs.'
  )
  assert measured.measured_on([_run(status='oom')]) == 'No measured runs in these results.'
  unknown = _run(device={}, jax_version=None, timestamp=None)
  assert measured.measured_on([unknown]) == 'Measured: 1 run.'


def test_runs_on_two_gpus_are_rows_of_their_own_with_the_gpu_named(toy):
  h200 = _run()
  h100 = _run(
    device={'platform': 'gpu', 'kind': 'NVIDIA H100 80GB HBM3', 'pool_bytes': 80_800_000_000},
    timestamp='2026-12-06T03:40:00+00:00',
    measurement={**_run()['measurement'], 'units_per_s': 50.0},
  )
  # The later run on the other GPU replaces nothing: each GPU speaks for its own row, and the
  # table names the GPU, in the catalog's order (jaxbench/data/gpus.csv: the H100 first).
  t = measured.table([h200, h100])
  assert t.header[:4] == ['workload', 'precision', 'GPU', 'memory']
  assert [(r[2], r[3], r[5]) for r in t.rows] == [
    ('H100 80GB HBM3', 'full', '50.0 images/s'),
    ('H200', 'full', '67.7 images/s'),
  ]
  assert any(n.startswith('GPU: ') for n in t.notes)
  assert measured.others([h200, h100]).header == t.header
  # One GPU: no column, as before.
  alone = measured.table([h200])
  assert alone.header == measured.HEADER and not any(n.startswith('GPU: ') for n in alone.notes)


def test_among_earlier_forms_the_run_nearest_todays_default_speaks(toy):
  """After a revision changes a default, no run is of today's program: the run that differed
  from the old default in nothing speaks, not a later one that changed another key too."""
  fixed = {'search': {'mode': 'fixed', 'trials': []}, 'max_batch': 32, 'workload_revision': 1}
  old_default = {**_run()['config'], 'resample': 'shifts'}  # revision 1's default, say
  plain = _run(**fixed, config=old_default)
  other = _run(
    **fixed,
    overrides=[['lr', '0.01']],
    config={**old_default, 'lr': 0.01},
    timestamp='2026-12-02T00:00:00+00:00',  # later
  )
  assert commands.keys_off_default(plain) == 1 and commands.keys_off_default(other) == 2
  t, rest = measured.table([plain, other]), measured.others([plain, other])
  assert t.rows[0][10] == commands.command_of(plain)
  assert [r[10] for r in rest.rows] == [commands.command_of(other)]
