"""Test-wide settings: tests check behaviour at tiny shapes, so compile fast rather than well."""

import os

# XLA:CPU's LLVM optimization is most of a tiny model's compile time and buys
# nothing at these shapes (measured: about 30% off the suite's CPU time).
if 'xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (
    os.environ.get('XLA_FLAGS', '') + ' --xla_backend_optimization_level=0'
  ).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
