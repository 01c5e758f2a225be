"""Test-wide settings: tests check behaviour at tiny shapes, so compile fast rather than well."""

import os

import pytest

# XLA:CPU's LLVM optimization is most of a tiny model's compile time and buys
# nothing at these shapes (measured: about 30% off the suite's CPU time).
if 'xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (
    os.environ.get('XLA_FLAGS', '') + ' --xla_backend_optimization_level=0'
  ).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')


@pytest.fixture
def no_collection_after_a_failed_trial(request, monkeypatch):
  """A failed trial ends in jaxbench.core.program.release(), a gc.collect(): a second or so in a
  test worker whose heap holds the compiled programs of earlier tests, and a FakeProgram holds no
  arrays. For the search and prediction tests (their `pytestmark`); a test marked `releases`
  (the one that checks what a failed trial leaves) keeps it."""
  if 'releases' not in request.keywords:
    from jaxbench.core import program  # pylint: disable=g-import-not-at-top

    monkeypatch.setattr(program, 'release', lambda: None)
