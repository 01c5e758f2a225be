"""XLA set-up before the backend starts: flags, the memory cap, the refusal afterwards."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code, **env):
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': '', **env}
  r = subprocess.run(
    [sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 0, r.stderr
  return r.stdout.strip()


def test_remat_is_disabled_unless_asked_and_triton_gemm_off_by_default():
  code = (
    'import os; from jaxbench.core import backend; m = backend.configure({limit}, {remat}); '
    'print(os.environ["XLA_FLAGS"]); print(m.describe())'
  )
  flags, described = _python(code.format(limit=None, remat=False)).splitlines()
  assert '--xla_disable_hlo_passes=rematerialization' in flags.split()
  assert '--xla_gpu_enable_triton_gemm=false' in flags.split()
  assert described == 'full device memory'
  flags, described = _python(code.format(limit=0.5, remat=True)).splitlines()
  assert 'rematerialization' not in flags
  # Without a GPU the limit is enforced on the compile-time analysis.
  assert described == '0.5 GB limit (checked against compile-time analysis)'


def test_autotune_level_is_xlas_unless_given():
  code = (
    'import os; from jaxbench.core import backend; '
    'backend.configure(None, False, autotune_level={}); print(os.environ["XLA_FLAGS"])'
  )
  assert 'autotune' not in _python(code.format(None))
  assert '--xla_gpu_autotune_level=1' in _python(code.format(1)).split()


def test_autotune_log_is_given_to_xla_as_an_absolute_path(tmp_path):
  where = tmp_path / 'logs' / 'at.txt'
  code = (
    'import os; from jaxbench.core import backend; '
    f'backend.configure(None, False, autotune_log={str(where)!r}); '
    'print(os.environ["XLA_FLAGS"])'
  )
  assert f'--xla_gpu_dump_autotune_logs_to={where}' in _python(code).split()
  assert (tmp_path / 'logs').is_dir()  # XLA writes the file but makes no folder


def test_configure_refuses_once_the_backend_has_started():
  out = _python(
    'import jax; jax.devices(); from jaxbench.core import backend\n'
    'try:\n  backend.configure(None, False)\nexcept backend.BackendError as e:\n'
    '  print("refused:", e)'
  )
  assert out.startswith('refused: the JAX backend already started')


def test_existing_xla_flags_are_kept():
  out = _python(
    'import os; from jaxbench.core import backend; backend.configure(None, False); '
    'print(os.environ["XLA_FLAGS"])',
    XLA_FLAGS='--xla_dump_to=/tmp/x',
  )
  assert out.split()[0] == '--xla_dump_to=/tmp/x'


def test_importing_every_workload_leaves_the_backend_unstarted():
  """main configures XLA after parsing flags: no model module may start JAX on import."""
  out = _python(
    'from models import registry; from jax._src import xla_bridge; '
    'print(len(registry.names()), xla_bridge.backends_are_initialized())'
  )
  assert out.split()[1] == 'False', out


def test_autotune_cache_dir_is_made_and_given_to_xla(tmp_path):
  where = tmp_path / 'autotune'
  code = (
    'import os, jax; from jaxbench.core import backend; '
    f'backend.configure(None, False, autotune_cache_dir={str(where)!r}); '
    'jax.devices(); print(os.environ["XLA_FLAGS"])'  # XLA parses the flags as it starts
  )
  assert f'--xla_gpu_per_fusion_autotune_cache_dir={where}' in _python(code).split()
  assert where.is_dir()


def test_autotune_cache_dir_beside_a_compilation_cache_is_the_one_compiles_use(tmp_path):
  """JAX points XLA's autotune cache into a persistent compilation cache, over XLA_FLAGS;
  --autotune_cache_dir must win, and without it the compilation cache keeps the results."""
  code = (
    'import jax; from jaxbench.core import backend; '
    'backend.configure(None, False, compilation_cache_dir={jcc!r}{atc}); '
    'jax.jit(lambda x: x * 2)(1.0); '
    'from jax._src import compiler; '
    'o = compiler.get_compile_options(num_replicas=1, num_partitions=1); '
    'print(o.executable_build_options.debug_options.xla_gpu_per_fusion_autotune_cache_dir)'
  )
  jcc, atc = str(tmp_path / 'jcc'), str(tmp_path / 'atc')
  given = _python(code.format(jcc=jcc, atc=f', autotune_cache_dir={atc!r}'))
  assert given.splitlines()[-1] == atc
  alone = _python(code.format(jcc=jcc, atc=''))
  assert alone.splitlines()[-1] == os.path.join(jcc, 'xla_gpu_per_fusion_autotune_cache_dir')


@pytest.mark.skipif(
  bool(shutil.which('nvidia-smi') or glob.glob('/dev/nvidia[0-9]*')), reason='a GPU host'
)
def test_without_a_gpu_jax_runs_on_the_cpu_without_trying_cuda():
  """The CUDA plugin of '.[cuda]' prints a traceback where there is no GPU: not asked for."""
  code = (
    'import os; from jaxbench.core import backend; backend.configure(None, False); '
    'print(os.environ.get("JAX_PLATFORMS"))'
  )
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  r = subprocess.run(
    [sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == 'cpu'
