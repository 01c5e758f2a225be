"""--frameworks: each framework in a fresh process, printed side by side with the ratios."""

import json
import re

import pytest

from jaxbench.pytorch import frameworks
from jaxbench.results import commands, measured, records, store
from models import registry
from tests import test_measured
from tests import test_pytorch_harness as harness

ROOT = harness.ROOT


def result(framework, max_batch, units_per_s, status='ok', compile_s=None):
  return {
    'framework': framework,
    'workload': 'bert_base',
    'precision': 'bf16',
    'unit': 'sequences',
    'throughput_unit': 'sequences/s',
    'max_batch': max_batch,
    'status': status,
    'measurement': {'units_per_s': units_per_s, 'compile_s': compile_s},
  }


def cells(text: str, row: int) -> list[str]:
  """The cells of a row of an aligned table (two spaces or more between them)."""
  return re.split(r' {2,}', text.splitlines()[row].strip())


def test_side_by_side_gives_jax_over_pytorch_for_batch_and_throughput():
  text = records.side_by_side(
    [result('jax', 512, 1500.0), result('pytorch', 256, 1000.0, compile_s=42.0)]
  )
  header, row = cells(text, 0), cells(text, 2)
  assert header[:5] == ['workload', 'precision', 'max batch JAX', 'max batch PyTorch', 'ratio']
  assert row == [
    'bert_base',
    'bf16',
    '512 sequences',
    '256 sequences',
    '2.00x',
    '1,500.0 sequences/s',
    '1,000.0 sequences/s',
    '1.50x',
    '42.0',
  ]


def test_side_by_side_has_no_ratio_where_a_side_failed_or_is_missing():
  text = records.side_by_side(
    [result('jax', 512, 1500.0), result('pytorch', 0, None, status='oom')]
  )
  row = cells(text, 2)
  assert row[3] == '0 sequences (oom)' and row[4] == '-' and row[7] == '-'
  alone = cells(records.side_by_side([result('jax', 512, 1500.0)]), 2)
  assert alone[3] == '-' and alone[4] == '-'


def test_each_child_gets_the_flags_with_its_framework_and_output():
  argv = ['--model=bert_base', '--frameworks', 'jax,pytorch', '--output', 'all.jsonl', '--steps=4']
  assert frameworks.child_args(argv, 'pytorch', '/t/p.jsonl', True) == [
    '--model=bert_base',
    '--steps=4',
    '--framework=pytorch',
    '--output=/t/p.jsonl',
    '--tiny',
  ]
  argv = ['--frameworks=jax,pytorch', '--notiny', '--torch_compile', '--output=x']
  assert frameworks.child_args(argv, 'jax', 'j', False) == [
    '--framework=jax',
    '--output=j',
    '--notiny',
  ]  # --torch_compile is the PyTorch side's
  assert '--torch_compile' in frameworks.child_args(argv, 'pytorch', 'p', False)


@pytest.mark.parametrize(
  'args, says',
  [
    (['--frameworks=jax,jax'], '--frameworks'),
    (['--frameworks=jax,tensorflow'], '--frameworks'),
    (['--frameworks=jax,pytorch', '--framework=pytorch'], 'conflict'),
    (['--frameworks=jax', '--torch_compile'], '--torch_compile'),
  ],
)
def test_bad_framework_lists_are_one_line_and_status_2(tmp_path, args, says):
  r = harness.jaxbench(harness.site(tmp_path, *harness.TOY_SITE), '--model=bert_base', *args)
  harness.one_line_error(r, says)


def test_check_accepts_both_frameworks(tmp_path):
  r = harness.jaxbench(
    harness.site(tmp_path, *harness.TOY_SITE),
    '--model=bert_base',
    '--frameworks=jax,pytorch',
    '--torch_compile',
    '--check',
  )
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == 'jaxbench: ok: the flags are valid for bert_base under jax, pytorch'


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
  assert lines[0].split()[:3] == ['workload', 'precision', 'max'], r.stdout
  row = cells(r.stdout.strip(), 2)
  jax_rate, torch_rate = (s['measurement']['units_per_s'] for s in stored)
  assert row[4] == '1.00x' and row[7] == f'{jax_rate / torch_rate:.2f}x', r.stdout
  # Each framework ran in a child of its own: the progress names both commands.
  assert '--framework=jax' in r.stderr and '--framework=pytorch' in r.stderr


@pytest.fixture
def toy(monkeypatch):
  """test_measured's toy workload in the registry (its records' workload)."""
  real, workload = registry.get, test_measured.Toy()
  monkeypatch.setattr(registry, 'get', lambda n: workload if n == 'toy' else real(n))


def torch_run(**changes):
  r = test_measured._run(framework='pytorch', torch_version='2.11.0', **changes)
  del r['jax_version'], r['xla_flags']
  return r


def test_the_report_puts_the_pytorch_peer_beside_its_jax_row_with_the_ratios(toy):
  jax_run = test_measured._run(framework='jax')
  peer = torch_run(
    max_batch=82,
    torch_compile=True,
    measurement={**jax_run['measurement'], 'units_per_s': 33.83},
    timestamp='2026-12-02T01:00:00+00:00',
  )
  other_precision = torch_run(precision='fp32')
  t = measured.table([jax_run, peer, other_precision])
  assert len(t.rows) == 1  # PyTorch runs are no rows of their own
  cells = dict(zip(t.header, t.rows[0]))
  assert cells['throughput'] == '67.7 images/s'
  assert cells['PyTorch'] == '82 images, 33.8 images/s compiled'
  assert cells['JAX/PyTorch'] == 'batch 2.00x, throughput 2.00x'
  assert any(n.startswith('PyTorch:') for n in t.notes)
  alone = measured.table([jax_run])
  assert 'PyTorch' not in alone.header and len(alone.header) == len(alone.rows[0])


def test_a_pytorch_record_is_a_cell_and_a_command_of_its_own(toy):
  jax_run, peer = test_measured._run(), torch_run(torch_compile=True)
  assert store.key_of(jax_run) != store.key_of(peer)
  assert store.key_of(peer) != store.key_of(torch_run())  # eager and compiled apart
  assert len(store.latest([jax_run, peer])) == 2
  command = commands.command_of(peer)
  assert '--framework=pytorch --torch_compile' in command and '--triton_gemm' not in command
  assert '--framework' not in commands.command_of(jax_run)
