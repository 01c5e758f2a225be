"""Bad input on the command line never reaches a traceback: --check and the run refuse the same
commands with the same line, files are proven writable before a run, and a run's result is
never lost at the end."""

import json
import math
import os
import subprocess
import sys

import pytest

from jaxbench.core import backend, bench
from models import registry
from tests import forked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A run that ends in seconds on the CPU: tiny BERT, a fixed batch, one timed step.
FAST = ('--tiny', '--batch_size=2', '--steps=1', '--windows=1', '--warmup_steps=0')


def command(*args, module='jaxbench.main', prelude=None):
  """Run the command; `prelude`: Python run in the process first (to break something)."""
  argv = [sys.executable, '-m', module, *args]
  if prelude:
    argv = [
      sys.executable,
      '-c',
      f'{prelude}\nimport runpy\nrunpy.run_module({module!r}, '
      "run_name='__main__', alter_sys=True)",
      *args,
    ]
  return subprocess.run(
    argv,
    cwd=ROOT,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=600,
  )


def refused(p, says=''):
  """One line on stderr, status 2, no traceback."""
  lines = p.stderr.splitlines()
  assert p.returncode == 2, (p.returncode, p.stderr)
  assert 'Traceback' not in p.stderr and len(lines) == 1, p.stderr
  assert says in lines[0], lines[0]
  return lines[0]


def _garbage_hints(tmp_path):
  path = tmp_path / 'hints.jsonl'
  path.write_text('not a result\n')
  return f'--search_hints={path}'


BAD = [
  ('--model=bert_base', '--set=heads=0'),
  ('--model=bert_base', '--set=heads=3'),
  ('--model=bert_base', '--set=hidden=-8'),
  ('--model=bert_base', '--set=masked=128'),
  ('--model=bert_base', '--set=layers=0'),
  ('--model=bert_base', '--set=layers=abc'),
  ('--model=mask_rcnn', '--set=blocks=[3,4,6]'),
  ('--model=bert_base', '--output=/dev/full'),
  ('--model=bert_base', '--output=/proc/jaxbench.jsonl'),
  ('--model=bert_base', '--progress_file=/proc/jaxbench.json'),
]


@pytest.fixture(scope='module')
def bad_runs(tmp_path_factory):
  """Each of BAD's command lines with --check and without (in one batch: tests/forked.py), and
  the directory of the --output it names where it names none."""
  dirs, runs = [], []
  for args in BAD:
    where = tmp_path_factory.mktemp('bad')
    output = (
      () if any(a.startswith('--output') for a in args) else (f'--output={where / "out.jsonl"}',)
    )
    dirs.append(where)
    runs += [[*args, *FAST, *output, '--check'], [*args, *FAST, *output]]
  done = forked.run(runs)
  return [(done[2 * i], done[2 * i + 1], where) for i, where in enumerate(dirs)]


@pytest.mark.parametrize('args', BAD)
def test_check_and_run_refuse_bad_input_alike(args, bad_runs):
  check, run, where = bad_runs[BAD.index(args)]
  assert refused(check) == refused(run)
  assert os.listdir(where) == []  # nothing written


def test_the_preset_a_run_gets_without_tiny_is_the_one_check_checks(tmp_path):
  # Without a GPU a run gets the tiny preset unless --notiny: heads=3 divides BERT-base's 768
  # but not the tiny preset's width, so both refuse it.
  args = ('--model=bert_base', '--set=heads=3', '--batch_size=2', '--steps=1', '--windows=1')
  check, run = forked.run([[*args, '--check'], list(args)])
  assert refused(check, 'must divide hidden') == refused(run)


def test_hints_that_hold_no_result_are_refused_alike(tmp_path):
  hints = _garbage_hints(tmp_path)
  check, run = forked.run(
    [['--model=bert_base', *FAST, hints, '--check'], ['--model=bert_base', *FAST, hints]]
  )
  assert refused(check, 'holds no result') == refused(run)


def test_check_reports_the_lines_of_hints_that_are_not_results(tmp_path):
  good = tmp_path / 'good.jsonl'
  with open(os.path.join(ROOT, 'docs', 'results', 'h200.jsonl')) as f:
    good.write_text(f.readline() + '{"cut short\n')
  p = command('--model=bert_base', *FAST, f'--search_hints={good}', '--check')
  assert p.returncode == 0, p.stderr
  assert 'Traceback' not in p.stderr and str(good) in p.stderr and 'line' in p.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason='root writes in a read-only directory')
def test_a_read_only_directory_is_refused_before_the_run(tmp_path):
  ro = tmp_path / 'ro'
  ro.mkdir()
  ro.chmod(0o555)
  for flag in ('--output', '--progress_file'):
    args = ('--model=bert_base', *FAST, f'{flag}={ro / "x"}')
    assert refused(command(*args, '--check'), flag) == refused(command(*args), flag)
  assert os.listdir(ro) == []


def test_report_out_naming_a_file_is_one_line(tmp_path):
  existing = tmp_path / 'report.md'
  existing.write_text('kept\n')
  store = os.path.join(ROOT, 'docs', 'results', 'h200.jsonl')
  for p in forked.run(
    [[f'--store={store}', f'--out={out}'] for out in (existing, existing / 'sub')],
    module='jaxbench.report_main',
  ):
    refused(p, '--out')
  assert existing.read_text() == 'kept\n'


@pytest.mark.slow
@pytest.mark.parametrize(
  'args', [('--model=bert_base',), ('--model=bert_base', '--set=layers=1', '--set=heads=2')]
)
def test_check_and_run_accept_good_input_alike(args, tmp_path):
  out = tmp_path / 'out.jsonl'
  check = command(*args, *FAST, f'--output={out}', '--check')
  assert check.returncode == 0 and check.stdout.startswith('jaxbench: ok'), check.stderr
  assert not out.exists()  # --check leaves nothing behind
  run = command(*args, *FAST, f'--output={out}')
  assert run.returncode == 0, run.stderr
  assert [json.loads(line)['status'] for line in out.read_text().splitlines()] == ['ok']


@pytest.mark.slow
def test_a_failed_final_write_gives_the_result_whole_on_stderr(tmp_path):
  out = tmp_path / 'out.jsonl'
  prelude = (
    'import errno, os\n'
    'from jaxbench.results import records\n'
    'def full(*args):\n'
    '  raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n'
    'records.write_jsonl = full'
  )
  p = command('--model=bert_base', *FAST, f'--output={out}', prelude=prelude)
  assert p.returncode == 1, p.stderr
  assert 'Traceback' not in p.stderr
  why, record = p.stderr.splitlines()[-2:]
  assert 'No space left on device' in why and str(out) in why
  result = json.loads(record)
  assert result['workload'] == 'bert_base' and result['status'] == 'ok'
  assert 'bert_base' in p.stdout  # the table is still printed
  assert out.read_text() == ''  # opened before the run; nothing half written


MEMORY = backend.MemorySetup(None, None, None, False)


def _one_step(name, *overrides, seed=0):
  """A fixed batch of one example at the tiny preset, two untimed steps and one timed."""
  w = registry.get(name)
  opts = bench.Options(
    tiny=True,
    overrides=tuple(overrides),
    batch_size=w.example_size(w.resolve(tiny=True)),
    warmup_steps=2,
    steps=1,
    windows=1,
    seed=seed,
  )
  return bench.run(w, opts, MEMORY, log=lambda line: None)


# What a forced divergence can meet: one loss and one update (bert_base), an update that clips
# the gradient's norm first (conv_seq2seq) and two networks updated in turn by two losses
# (stylegan). The rule under test (a non-finite loss makes the result invalid) is the harness's;
# each of the other workloads would cost its own tiny compile, up to 70 s on two CPU cores.
DIVERGING = ['bert_base', 'conv_seq2seq', 'stylegan']


def test_every_workload_has_the_lr_that_forces_a_divergence():
  assert all('lr' in w.config for w in registry.all_workloads())


@pytest.mark.slow
@pytest.mark.parametrize('name', DIVERGING)
def test_a_forced_divergence_is_reported_invalid(name):
  result = _one_step(name, ('lr', '1e30'))
  assert result['status'] == 'invalid', (result['status'], result['error'])
  assert not math.isfinite(result['measurement']['final_loss'])
  assert result['measurement']['units_per_s'] is None


@pytest.mark.slow
def test_the_same_seed_gives_the_same_loss():
  first, again = _one_step('bert_base'), _one_step('bert_base')
  other = _one_step('bert_base', seed=1)
  loss = first['measurement']['final_loss']
  assert math.isfinite(loss) and loss == again['measurement']['final_loss']
  assert loss != other['measurement']['final_loss']
