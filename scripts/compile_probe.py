"""Where a workload's compile time goes: tracing+lowering vs XLA compile, per XLA flag set."""

import functools
import os
import sys
import time

import jax

from jaxbench import precision, registry
from jaxbench import program as prog

name, n, pol = sys.argv[1], int(sys.argv[2]), sys.argv[3]
w = registry.get(name)
p = prog.Program(w, w.resolve(), precision.get(pol))
batch = jax.eval_shape(functools.partial(p.trainer.make_batch, n=n), p.rng)
t0 = time.perf_counter()
with jax.default_matmul_precision(p.policy.matmul_precision):
  lowered = p._step.lower(p.state_shapes, batch, p.rng)
t1 = time.perf_counter()
c = lowered.compile()
t2 = time.perf_counter()
m = c.memory_analysis()
print(
  f'{name} n={n} {pol} flags={os.environ.get("XLA_FLAGS", "")!r}: '
  f'lower {t1 - t0:.1f}s compile {t2 - t1:.1f}s '
  f'temp {m.temp_size_in_bytes / 1e9:.2f}GB args {m.argument_size_in_bytes / 1e9:.2f}GB',
  flush=True,
)
