"""--frameworks: each framework in a fresh process, printed side by side with the ratios."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from jaxbench import cli
from jaxbench.pytorch import frameworks, usage
from jaxbench.results import commands, measured, records, side_by_side, store
from models import registry
from tests import forked, test_measured
from tests import test_pytorch_harness as harness

ROOT = harness.ROOT


def result(framework, max_batch, units_per_s, status='ok', compile_s=None, **extra):
  return {
    'framework': framework,
    'workload': 'bert_base',
    'precision': 'bf16',
    'device': {'platform': 'gpu', 'kind': 'NVIDIA H200', 'count': 1},
    'unit': 'sequences',
    'throughput_unit': 'sequences/s',
    'max_batch': max_batch,
    'status': status,
    'measurement': {'units_per_s': units_per_s, 'compile_s': compile_s},
    **extra,
  }


def cells(text: str, row: int) -> list[str]:
  """The cells of a row of an aligned table (two spaces or more between them)."""
  return re.split(r' {2,}', text.splitlines()[row].strip())


def test_side_by_side_gives_the_device_and_jax_over_pytorch_for_batch_and_throughput():
  text = records.side_by_side([result('jax', 512, 1500.0), result('pytorch', 256, 1000.0)])
  header, row = cells(text, 0), cells(text, 2)
  assert header == [
    'workload',
    'precision',
    'device',
    'max batch JAX',
    'max batch PyTorch',
    'ratio',
    'throughput JAX',
    'throughput PyTorch',
    'ratio',
  ]
  assert row == [
    'bert_base',
    'bf16',
    'NVIDIA H200',
    '512 sequences',
    '256 sequences',
    '2.00x',
    '1,500.0 sequences/s',
    '1,000.0 sequences/s',
    '1.50x',
  ]


def test_side_by_side_puts_eager_and_compiled_apart_and_divides_by_the_better():
  runs = [
    result('jax', 64, 1500.0),
    result('pytorch', 64, 1000.0),
    result('pytorch', 64, 1200.0, compile_s=42.0, torch_compile=True),
    result('jax', 64, 900.0, precision='tf32'),
    result('pytorch', 64, 1000.0, precision='tf32'),
    result('pytorch', 64, 600.0, compile_s=40.0, torch_compile=True, precision='tf32'),
  ]
  text = records.side_by_side(runs)
  table = [dict(zip(cells(text, 0), cells(text, i))) for i in (2, 3)]
  assert cells(text, 0)[-3:] == ['throughput PyTorch compiled', 'ratio', 'compile s PyTorch']
  bf16, tf32 = table
  assert bf16['precision'] == 'bf16' and tf32['precision'] == 'tf32'  # a row per precision
  assert bf16['throughput PyTorch eager'] == '1,000.0 sequences/s'
  assert bf16['throughput PyTorch compiled'] == '1,200.0 sequences/s'
  # 'ratio' is the throughput's (the last column of that name)
  assert bf16['ratio'] == f'{1500 / 1200:.2f}x'  # against compiled, the better here
  assert tf32['ratio'] == '0.90x'  # against eager, the better here
  assert bf16['compile s PyTorch'] == '42.0' and tf32['compile s PyTorch'] == '40.0'


def test_side_by_side_has_no_ratio_where_a_side_failed_or_is_missing():
  text = records.side_by_side(
    [result('jax', 512, 1500.0), result('pytorch', 0, None, status='oom')]
  )
  row = cells(text, 2)
  assert row[4] == '0 sequences (oom)' and row[5] == '-' and row[8] == '-'
  alone = cells(records.side_by_side([result('jax', 512, 1500.0)]), 2)
  assert alone[4] == '-' and alone[5] == '-'


def test_each_child_gets_the_flags_with_its_framework_and_output():
  argv = ['--model=bert_base', '--frameworks', 'jax,pytorch', '--output', 'all.jsonl', '--steps=4']
  pytorch = frameworks.Child('pytorch')
  assert frameworks.child_args(argv, pytorch, '/t/p.jsonl', True) == [
    '--model=bert_base',
    '--steps=4',
    '--framework=pytorch',
    '--notorch_compile',
    '--output=/t/p.jsonl',
    '--tiny',
  ]
  argv = ['--frameworks=jax,pytorch', '--notiny', '--torch_compile', '--output=x']
  assert frameworks.child_args(argv, frameworks.Child('jax'), 'j', False) == [
    '--framework=jax',
    '--output=j',
    '--notiny',
  ]  # --torch_compile is the PyTorch side's
  compiled = frameworks.Child('pytorch', torch_compile=True)
  assert '--torch_compile' in frameworks.child_args(argv, compiled, 'p', False)


def test_xla_options_and_search_hints_go_to_the_jax_children_only():
  argv = [
    '--frameworks=jax,pytorch',
    '--compilation_cache_dir',
    '/c',
    '--autotune_level=2',
    '--triton_gemm',
    '--search_hints',
    'h.jsonl',
    '--steps=4',
  ]
  assert frameworks.child_args(argv, frameworks.Child('pytorch'), 'p', False) == [
    '--steps=4',
    '--framework=pytorch',
    '--notorch_compile',
    '--output=p',
    '--notiny',
  ]
  assert frameworks.child_args(argv, frameworks.Child('jax'), 'j', False) == [
    *argv[1:],
    '--framework=jax',
    '--output=j',
    '--notiny',
  ]


def test_a_pytorch_run_refuses_xla_options_a_comparison_passes_them_on():
  with pytest.raises(usage.Refused, match='--compilation_cache_dir is for JAX runs'):
    usage.check(args(frameworks=(), framework='pytorch', compilation_cache_dir='/c'), ())
  with pytest.raises(usage.Refused, match='--search_hints is for JAX runs'):
    usage.check(args(frameworks=(), framework='pytorch', search_hints=('h.jsonl',)), ())
  usage.check(args(compilation_cache_dir="/c", triton_gemm=True, search_hints=('h.jsonl',)), ())


def args(**changes):
  base = dict(model=('bert_base',), frameworks=('jax', 'pytorch'), tiny=True)
  return cli.Args(**{**base, **changes})


def test_each_framework_runs_once_per_precision_and_pytorch_eager_and_compiled():
  kids = frameworks.children(args(precisions=('tf32', 'bf16'), torch_compile=True), ())
  assert [k.name for k in kids] == [
    'jax tf32',
    'pytorch eager tf32',
    'pytorch compiled tf32',
    'jax bf16',
    'pytorch eager bf16',
    'pytorch compiled bf16',
  ]
  argv = ['--model=bert_base', '--frameworks=jax,pytorch', '--precisions', 'tf32,bf16']
  argv += ['--torch_compile', '--steps=4']
  assert frameworks.child_args(argv, kids[2], 'p', False) == [
    '--model=bert_base',
    '--steps=4',
    '--framework=pytorch',
    '--torch_compile',
    '--precision=tf32',
    '--output=p',
    '--notiny',
  ]
  eager = frameworks.child_args(argv, kids[4], 'p', False)
  assert '--notorch_compile' in eager and '--torch_compile' not in eager
  assert '--precision=bf16' in eager and 'tf32,bf16' not in eager
  jax = frameworks.child_args(argv, kids[3], 'j', False)
  assert not any('torch_compile' in x for x in jax) and '--precision=bf16' in jax


def test_reference_batch_runs_each_workload_at_its_own_batch_in_its_units():
  assert set(frameworks.REFERENCE_BATCH) == {w.name for w in registry.all_workloads()}
  workloads = cli.resolve_models(('bert_base', 'transformer_big', 'pix2pixhd'))
  kids = frameworks.children(args(reference_batch=True), workloads)
  assert [(k.framework, k.model, k.batch_size) for k in kids] == [
    ('jax', 'bert_base', 64),
    ('pytorch', 'bert_base', 64),
    ('jax', 'transformer_big', 16_384),  # tokens: the child rounds down to whole examples
    ('pytorch', 'transformer_big', 16_384),
    ('jax', 'pix2pixhd', 1),
    ('pytorch', 'pix2pixhd', 1),
  ]
  argv = ['--model', 'bert_base,transformer_big', '--frameworks=jax,pytorch', '--reference_batch']
  assert frameworks.child_args(argv, kids[3], 'o', True) == [
    '--framework=pytorch',
    '--notorch_compile',
    '--model=transformer_big',
    '--batch_size=16384',
    '--output=o',
    '--tiny',
  ]


@pytest.mark.parametrize(
  'changes, says',
  [
    (dict(reference_batch=True, frameworks=()), '--reference_batch compares frameworks'),
    (dict(reference_batch=True, batch_size=8), '--reference_batch and --batch_size conflict'),
    (dict(precisions=('bf16',), precision='fp32'), '--precision and --precisions conflict'),
  ],
)
def test_conflicting_comparison_flags_are_refused(changes, says):
  with pytest.raises(cli.UsageError, match=says):
    frameworks._plans(args(**changes))


REFUSED = [
  (
    [
      '--model=bert_base',
      '--frameworks=jax,pytorch',
      '--check',
      '--reference_batch',
      '--batch_size=8',
    ],
    '--reference_batch and --batch_size conflict',
  ),
  (
    ['--model=bert_base', '--precisions=bf16,tf32', '--check'],
    '--precisions is for sweeps (--store) and --frameworks',
  ),
  (['--model=bert_base', '--frameworks=jax,jax'], '--frameworks'),
  (['--model=bert_base', '--frameworks=jax,tensorflow'], '--frameworks'),
  (['--model=bert_base', '--frameworks=jax,pytorch', '--framework=pytorch'], 'conflict'),
  (['--model=bert_base', '--frameworks=jax', '--torch_compile'], '--torch_compile'),
]
ACCEPTED = [
  (
    ['--model=bert_base', '--torch_compile'],
    'bert_base under jax, pytorch eager, pytorch compiled',
  ),
  (
    [
      '--model=bert_base,transformer_big',
      '--precisions=tf32,bf16',
      '--reference_batch',
      '--torch_compile',
    ],
    'bert_base, transformer_big at their reference batches in tf32, bf16 under jax, pytorch '
    'eager, pytorch compiled',
  ),
]


@pytest.fixture(scope='module')
def toy_runs(tmp_path_factory):
  """REFUSED's command lines and ACCEPTED's with --frameworks=jax,pytorch --check, each with the
  toy peer installed, in one batch (tests/forked.py): {command line: its run}."""
  site = harness.site(tmp_path_factory.mktemp('site'), *harness.TOY_SITE)
  lines = [args for args, _ in REFUSED]
  lines += [[*args, '--frameworks=jax,pytorch', '--check'] for args, _ in ACCEPTED]
  return dict(zip(map(tuple, lines), forked.run(lines, env=site)))


@pytest.mark.parametrize('args, says', REFUSED[:2])
def test_refusals_are_one_line_and_status_2_also_under_check(toy_runs, args, says):
  harness.one_line_error(toy_runs[tuple(args)], says)


@pytest.mark.parametrize('args, says', ACCEPTED)
def test_check_says_the_precisions_batches_and_modes_it_accepts(toy_runs, args, says):
  r = toy_runs[(*args, '--frameworks=jax,pytorch', '--check')]
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == f'jaxbench: ok: the flags are valid for {says}'


@pytest.mark.parametrize('args, says', REFUSED[2:])
def test_bad_framework_lists_are_one_line_and_status_2(toy_runs, args, says):
  harness.one_line_error(toy_runs[tuple(args)], says)


@pytest.mark.slow
def test_both_frameworks_run_in_their_own_processes_and_print_the_ratio(tmp_path):
  out = tmp_path / 'all.jsonl'
  r = harness.jaxbench(
    harness.site(tmp_path, *harness.TOY_SITE),
    '--model=bert_base',
    '--frameworks=jax,pytorch',
    '--tiny',
    '--batch_size=2',
    '--steps=2',
    '--windows=1',
    '--warmup_steps=1',
    f'--output={out}',
  )
  assert r.returncode == 0, r.stderr
  stored = [json.loads(line) for line in out.read_text().splitlines()]
  assert [s['framework'] for s in stored] == ['jax', 'pytorch']
  assert all(s['status'] == 'ok' and s['max_batch'] == 2 for s in stored)
  assert stored[1]['torch_version'] and stored[0]['jax_version']
  lines = r.stdout.strip().splitlines()
  assert lines[0].split()[:3] == ['workload', 'precision', 'device'], r.stdout
  row = cells(r.stdout.strip(), 2)
  jax_rate, torch_rate = (s['measurement']['units_per_s'] for s in stored)
  assert row[5] == '1.00x' and row[8] == f'{jax_rate / torch_rate:.2f}x', r.stdout
  # Each framework ran in a child of its own: the progress names both commands.
  assert '--framework=jax' in r.stderr and '--framework=pytorch' in r.stderr


# In every process of the command: a JAX run's first steps write its process id to HANG_MARK and
# then hang, as a long compile or step would.
HANG_SITE = (
  'import os, time',
  'from jaxbench.core import program',
  'def _hang(self, compiled, steps):',
  '  with open(os.environ["HANG_MARK"] + ".tmp", "w") as f: f.write(str(os.getpid()))',
  '  os.replace(os.environ["HANG_MARK"] + ".tmp", os.environ["HANG_MARK"])',
  '  time.sleep(600)',
  'program.Program._run = _hang',
)


def _hanging_comparison(tmp_path, out):
  mark = tmp_path / 'child.pid'
  env = {**harness.site(tmp_path, *harness.TOY_SITE, *HANG_SITE), 'HANG_MARK': str(mark)}
  args = ['--model=bert_base', '--frameworks=jax,pytorch', '--tiny', '--batch_size=2']
  proc = subprocess.Popen(
    [sys.executable, '-m', 'jaxbench.main', *args, f'--output={out}'],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  deadline = time.monotonic() + 240
  while not mark.exists():
    assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
    time.sleep(0.1)
  return proc, int(mark.read_text())


def _gone(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat', encoding='ascii') as f:
      return f.read().rsplit(')', 1)[1].split()[0] in 'ZX'  # ended, not yet reaped
  except FileNotFoundError:
    return True


@pytest.mark.slow
def test_a_ctrl_c_stops_the_running_child_which_keeps_its_result_and_no_other_starts(tmp_path):
  out = tmp_path / 'all.jsonl'
  proc, child = _hanging_comparison(tmp_path, out)
  proc.send_signal(signal.SIGINT)  # a Ctrl-C at the terminal reaches the command only
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err
  assert err.splitlines()[-1] == 'jaxbench: interrupted', err
  assert '--framework=pytorch' not in err  # the next child never started
  (record,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert (record['framework'], record['status']) == ('jax', 'interrupted')
  assert _gone(child)


@pytest.mark.slow
def test_a_child_dies_with_its_command(tmp_path):
  proc, child = _hanging_comparison(tmp_path, tmp_path / 'all.jsonl')
  proc.kill()  # no moment to act: the child must not go on holding the GPU
  proc.wait()  # not communicate(): a child still alive would hold its stderr open
  deadline = time.monotonic() + 30
  try:
    while not _gone(child):
      assert time.monotonic() < deadline, f'child {child} outlived its command'
      time.sleep(0.1)
  finally:
    if not _gone(child):
      os.kill(child, signal.SIGKILL)
    proc.stdout.close()
    proc.stderr.close()


@pytest.fixture
def toy(monkeypatch):
  """test_measured's toy workload in the registry (its records' workload)."""
  real, workload = registry.get, test_measured.Toy()
  monkeypatch.setattr(registry, 'get', lambda n: workload if n == 'toy' else real(n))


def torch_run(**changes):
  r = test_measured._run(framework='pytorch', torch_version='2.11.0', **changes)
  del r['jax_version'], r['xla_flags']
  return r


def test_the_report_puts_the_pytorch_peer_beside_its_jax_run_with_the_ratios(toy):
  jax_run = test_measured._run(framework='jax')
  peer = torch_run(
    max_batch=82,
    torch_compile=True,
    measurement={**jax_run['measurement'], 'units_per_s': 33.83, 'compile_s': 41.0},
    timestamp='2026-12-02T01:00:00+00:00',
  )
  other_precision = torch_run(precision='fp32')
  t = measured.table([jax_run, peer, other_precision])
  assert len(t.rows) == 1  # PyTorch runs are no rows of their own
  assert t.header == measured.HEADER  # and no columns of the JAX table: side_by_side's
  cells = dict(zip(t.header, t.rows[0]))
  assert cells['throughput'] == '67.7 images/s'
  pair = side_by_side.table([jax_run, peer, other_precision])
  assert len(pair.rows) == 1
  cells = dict(zip(pair.header, pair.rows[0]))
  assert cells['batch'] == 'max 164 / 82 images, 2.00x'
  assert cells['PyTorch compiled'] == '33.8 images/s (compile 41.0 s)'
  assert cells['JAX / PyTorch'] == '2.00x'


def test_a_pytorch_record_is_a_cell_and_a_command_of_its_own(toy):
  jax_run, peer = test_measured._run(), torch_run(torch_compile=True)
  assert store.key_of(jax_run) != store.key_of(peer)
  assert store.key_of(peer) != store.key_of(torch_run())  # eager and compiled apart
  assert len(store.latest([jax_run, peer])) == 2
  command = commands.command_of(peer)
  assert '--framework=pytorch --torch_compile' in command and '--triton_gemm' not in command
  assert '--framework' not in commands.command_of(jax_run)
