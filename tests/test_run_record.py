"""A plain run's record on the CPU: its environment, its profile trace, its row in the report."""

import glob
import json
import os
import subprocess
import sys

import pytest

from jaxbench.core import environment
from jaxbench.results import measured, render

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVIRONMENT = (
  'jaxlib_version',
  'cuda_version',
  'cudnn_version',
  'cuda_driver_version',
  'driver_version',
  'flax_version',
  'optax_version',
  'git_commit',
)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """One tiny bert_base run at a fixed batch, with --output and --profile_dir."""
  tmp = tmp_path_factory.mktemp('run')
  out, profile = tmp / 'run.jsonl', tmp / 'profile'
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'jaxbench.main',
      '--model=bert_base',
      '--tiny',
      '--batch_size=2',
      '--steps=2',
      '--windows=1',
      '--warmup_steps=1',
      f'--output={out}',
      f'--profile_dir={profile}',
    ],
    capture_output=True,
    text=True,
    env={
      **{k: v for k, v in os.environ.items() if k != 'JAX_DEFAULT_PRNG_IMPL'},
      'PYTHONPATH': ROOT,
      'JAX_PLATFORMS': 'cpu',
    },
    cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stderr
  (record,) = [json.loads(line) for line in out.read_text().splitlines()]
  return tmp, out, profile, record


def test_the_record_carries_its_environment(run):
  record = run[3]
  for key in ENVIRONMENT:
    assert key in record, key
  import flax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  assert record['jaxlib_version'] == jaxlib.__version__
  assert record['flax_version'] == flax.__version__
  assert record['optax_version'] == optax.__version__
  for key in ('cuda_version', 'cudnn_version', 'cuda_driver_version', 'driver_version'):
    assert record[key] is None, key  # on the CPU: no CUDA, no driver
  assert record['prng_impl'] == 'threefry2x32'  # JAX's default: the run's environment names none
  if os.path.exists(os.path.join(ROOT, '.git')):
    head = subprocess.run(
      ['git', '-C', ROOT, 'rev-parse', 'HEAD'], capture_output=True, text=True
    ).stdout.strip()
    assert record['git_commit'].split('+')[0] == head


def test_git_commit_is_none_outside_a_checkout(monkeypatch, tmp_path):
  package = tmp_path / 'site' / 'jaxbench'
  package.mkdir(parents=True)
  monkeypatch.setattr(environment.jaxbench, '__file__', str(package / '__init__.py'))
  assert environment._git_commit() is None


def test_profile_dir_holds_a_trace_of_the_timed_steps(run):
  _, _, profile, record = run
  assert record['measurement']['profile_dir'] == str(profile)
  traces = glob.glob(str(profile / 'plugins' / 'profile' / '*' / '*.xplane.pb'))
  assert traces and os.path.getsize(traces[0]) > 0
  # A CPU's trace has no GPU kernels to sum (tests/test_kernel_time.py sums a GPU's).
  assert record['measurement']['profile'] == {
    'steps': 2,
    'kernel_ms_per_step': 0.0,
    'kernels_per_step': 0,
    'by_kind': [],
    'by_op': [],
  }


def test_a_runs_output_renders_into_the_report(run):
  tmp, out, _, record = run
  paths = render.write([str(out)], str(tmp / 'report'), render.DEFAULT_REFERENCE)
  page = (tmp / 'report' / 'README.md').read_text()
  table = page.split('## Measured runs')[1].split('### Other measured runs')[0]
  rows = [line for line in table.splitlines() if line.startswith('| bert_base |')]
  assert len(rows) == 1
  assert '| fp32 tiny | full | fixed 2 sequences |' in rows[0]
  assert f"| {measured.figure(record['measurement']['units_per_s'])} sequences/s |" in rows[0]
  del paths
