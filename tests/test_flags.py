"""The flags of both commands: help, the parser's one-line errors, and their plain values."""

import dataclasses
import os
import re
import subprocess
import sys

import pytest
from absl import flags

from flags import advanced as advanced_flags
from flags import validators
from jaxbench import cli
from jaxbench import main as jaxbench_main
from models import precision

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_FLAGS = {
  'model',
  'list_models',
  'describe',
  'check',
  'batch_size',
  'precision',
  'warmup_steps',
  'steps',
  'windows',
  'seed',
  'tiny',
  'set',
  'output',
  'profile_dir',
  'memory_limit_gb',
  'gpu',
  'memory_gb',
  'gpus',
  'precisions',
  'predict',
  'compile_for',
  'store',
  'cell_timeout_s',
  'retry_failed',
  'framework',
  'frameworks',
  'torch_compile',
  'reference_batch',
  'train_steps',
  'checkpoint_dir',
  'checkpoint_every',
  'checkpoint_keep',
  'log_every',
  'data',
  'data_dir',
  'devices',
  'shard_optimizer',
  'scaling',
  'coordinator_address',
  'num_processes',
  'process_id',
}
ADVANCED_FLAGS = {
  'remat',
  'verify_predicted_oom',
  'search_tolerance',
  'search_hints',
  'search_resume',
  'run_every_fit',
  'max_examples',
  'compilation_cache_dir',
  'autotune_level',
  'probe_autotune_level',
  'autotune_cache_dir',
  'autotune_log',
  'triton_gemm',
  'progress_file',
}
REPORT_FLAGS = {'store', 'out', 'reference_gpu'}


def command(module, *args):
  return subprocess.run(
    [sys.executable, '-m', module, *args],
    cwd=ROOT,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=120,
  )


def listed(help_text: str) -> set[str]:
  """The flags a help text lists, each as absl prints it: `  --name:` or `  --[no]name:`."""
  return set(re.findall(r'^\s+--(?:\[no\])?(\w+):', help_text, re.MULTILINE))


@pytest.mark.parametrize(
  'module, user', [('jaxbench.main', USER_FLAGS), ('jaxbench.report_main', REPORT_FLAGS)]
)
@pytest.mark.parametrize('ask', ['--help', '--helpshort'])
def test_short_help_lists_the_user_flags_and_exits_0(module, user, ask):
  r = command(module, ask)
  assert r.returncode == 0, r.stderr
  assert listed(r.stdout) == user, r.stdout  # not the advanced flags, nor absl's


@pytest.mark.parametrize(
  'module, user', [('jaxbench.main', USER_FLAGS), ('jaxbench.report_main', REPORT_FLAGS)]
)
def test_full_help_lists_every_flag_and_exits_0(module, user):
  by_module = flags.FLAGS.flags_by_module_dict()
  r = command(module, '--helpfull')
  assert r.returncode == 0, r.stderr
  shown = listed(r.stdout)
  assert user <= shown and 'helpshort' in shown, r.stdout
  if module == 'jaxbench.main':
    assert ADVANCED_FLAGS <= shown
  else:
    run = {f.name for m in ('flags.run', 'flags.search', 'flags.advanced') for f in by_module[m]}
    assert not (shown & run), 'the report defines no flags of the run'


BAD_FLAGS = [
  ('--no_such_flag', 'no_such_flag'),
  ('--memory_limit_gb=nan', '--memory_limit_gb'),
  ('--memory_limit_gb=inf', '--memory_limit_gb'),
  ('--memory_limit_gb=-1', '--memory_limit_gb'),
  ('--memory_limit_gb=0', '--memory_limit_gb'),
  ('--memory_gb=nan', '--memory_gb'),
  ('--memory_gb=-inf', '--memory_gb'),
  ('--batch_size=0', '--batch_size'),
  ('--batch_size=-4', '--batch_size'),
  ('--precision=fp8', '--precision'),
  ('--precisions=fp32,fp8', '--precisions'),
  ('--steps=0', '--steps'),
  ('--steps=many', '--steps'),
  ('--windows=0', '--windows'),
  ('--warmup_steps=-1', '--warmup_steps'),
  ('--seed=-1', '--seed'),
  ('--cell_timeout_s=-5', '--cell_timeout_s'),
  ('--max_examples=0', '--max_examples'),
  ('--search_tolerance=-0.1', '--search_tolerance'),
  ('--search_tolerance=1', '--search_tolerance'),
  ('--search_tolerance=nan', '--search_tolerance'),
  ('--autotune_level=5', '--autotune_level'),
  ('--probe_autotune_level=5', '--probe_autotune_level'),
]


@pytest.mark.parametrize('check', [False, True])
@pytest.mark.parametrize('bad, says', BAD_FLAGS)
def test_a_bad_flag_is_one_line_naming_it_and_status_2(bad, says, check, tmp_path):
  out = tmp_path / 'r.jsonl'
  r = command(
    'jaxbench.main', '--model=bert_base', bad, f'--output={out}', *(['--check'] if check else [])
  )
  assert r.returncode == 2, (r.returncode, r.stderr)
  lines = r.stderr.splitlines()
  assert len(lines) == 1 and 'Traceback' not in r.stderr, r.stderr
  assert lines[0].startswith('jaxbench: error: ') and says in lines[0], lines[0]
  assert r.stdout == '' and not out.exists()


@pytest.mark.parametrize(
  'args, says',
  [
    (['--no_such_flag'], 'no_such_flag'),
    (['--model=bert_base'], 'model'),  # a flag of the run, not of the report
    (['--max_examples=3'], 'max_examples'),
    (['--gpu=titan_rtx'], 'gpu'),  # a sweep's flag: the report shares only --store with it
    (['--store=x.jsonl', 'stray'], 'unexpected arguments: stray'),
  ],
)
def test_the_report_refuses_bad_flags_in_one_line(args, says):
  r = command('jaxbench.report_main', *args)
  assert r.returncode == 2, (r.returncode, r.stderr)
  lines = r.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith('jaxbench.report: error: '), r.stderr
  assert says in lines[0], lines[0]


def test_the_precision_flag_names_the_policies():
  assert list(validators.PRECISION_NAMES) == list(precision.POLICIES)


def test_the_values_read_from_default_flags_are_the_args_defaults():
  """cli.Args mirrors the flags: one field per flag of the run, with the flag's default."""
  fields = {f.name for f in dataclasses.fields(cli.Args)}
  assert fields == USER_FLAGS | ADVANCED_FLAGS
  assert jaxbench_main.read_args() == cli.Args()


def test_each_flag_module_defines_its_group():
  by_module = {m: {f.name for f in fl} for m, fl in flags.FLAGS.flags_by_module_dict().items()}
  assert by_module[advanced_flags.__name__] == ADVANCED_FLAGS
  user = by_module['flags.run'] | by_module['flags.search'] | by_module['flags.sweep']
  user |= by_module['flags.store'] | by_module['flags.pytorch'] | by_module['flags.train']
  user |= by_module['flags.parallel']
  assert user == USER_FLAGS
