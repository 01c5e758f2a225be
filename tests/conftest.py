"""Test-wide settings: tests check behaviour at tiny shapes, so compile fast rather than well."""

import os
import shutil
import tempfile

import pytest

# XLA:CPU's LLVM optimization is most of a tiny model's compile time and buys
# nothing at these shapes (measured: about 30% off the suite's CPU time).
if 'xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (
    os.environ.get('XLA_FLAGS', '') + ' --xla_backend_optimization_level=0'
  ).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# Many tests compile the same tiny programs: a workload's step in several test files, and the
# same --tiny run in each process a CLI test starts. One persistent compilation cache for the
# whole run, made here by the first process to import this file (pytest's, before it starts its
# xdist workers and they their jaxbench processes, all of which inherit the variable), compiles
# each once. Tests of the cache itself pass --compilation_cache_dir, which takes precedence.
_OWN_CACHE = 'JAX_COMPILATION_CACHE_DIR' not in os.environ
if _OWN_CACHE:
  _ROOT = tempfile.mkdtemp(prefix='jaxbench-tests-')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = os.path.join(_ROOT, 'cache')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5')
  # The temporary files of the tests and of the libraries they call go under the same root,
  # removed at the end: TFDS's DatasetInfo leaves a 'tmp*tfds' directory behind for every
  # dataset a mock-data test builds.
  os.makedirs(os.path.join(_ROOT, 'cache'))
  os.makedirs(os.path.join(_ROOT, 'tmp'))
  os.environ['TMPDIR'] = os.path.join(_ROOT, 'tmp')
  # A run keeps its initial state's compiled program under $XDG_CACHE_HOME/jaxbench
  # (jaxbench/core/init_cache.py): the tests' runs keep theirs here, not in the home directory.
  os.environ['XDG_CACHE_HOME'] = os.path.join(_ROOT, 'xdg')
  tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def pytest_unconfigure(config):
  if _OWN_CACHE:  # pytest's own process: its workers found the variable set
    shutil.rmtree(_ROOT, ignore_errors=True)


@pytest.fixture
def no_collection_after_a_failed_trial(request, monkeypatch):
  """A failed trial ends in jaxbench.core.program.release(), a gc.collect(): a second or so in
  a test worker whose heap holds the compiled programs of earlier tests, and a FakeProgram holds
  no arrays. A compile-only probe ends in release_host(), which also drops JAX's caches, and
  with them the compiled programs of the worker's later tests. For the search and prediction
  tests (their `pytestmark`); a test marked `releases` (one that checks what is released)
  keeps both."""
  if 'releases' not in request.keywords:
    from jaxbench.core import program  # pylint: disable=g-import-not-at-top

    monkeypatch.setattr(program, 'release', lambda: None)
    monkeypatch.setattr(program, 'release_host', lambda: None)
