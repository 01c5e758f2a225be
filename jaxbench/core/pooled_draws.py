"""The initial state's random draws, made as a few large draws instead of one per array.

A workload's init draws each parameter array on its own: jax.random.truncated_normal for a
convolution kernel, normal for an embedding, uniform for a bias, each from its own key and each
with its distribution's arithmetic (a truncated normal's inverse error function) on its own
shape. XLA compiles each draw into kernels of their own, and that compile is what building the
initial state costs on a GPU: nasnet_large's init program holds 1,584 fusions and 979 threefry
kernels, and compiled for the H200 in 19 s to run in milliseconds (docs/performance.md).

`pooled(init)` runs the init twice. First abstractly (jax.eval_shape), to list its draws in
order; then for real, with one draw per distribution and parameters (every truncated normal on
[-2, 2] in float32, say) made over the elements of all of that group's arrays at once, up to
POOL_ELEMENTS a draw, each of the init's calls given the next slice of it. The distributions are
the same; the values are not those of the per-array draws, and the keys the init passes in are
not used for them. A draw is pooled only where it is made at the init's own level (not inside a
vmap or a scan, where one call stands for many draws) and its parameters are plain numbers; any
other draw is made as the init asked.
"""

import contextlib
import dataclasses
import inspect
import threading
from typing import Any, Callable

import jax
import numpy as np

POOLED = ('normal', 'truncated_normal', 'uniform')

try:  # the module whose functions Flax's and JAX's initializers call, and their signatures
  from jax._src import core as _core
  from jax._src import random as _random

  _SIGNATURES = {n: inspect.signature(getattr(_random, n)) for n in POOLED}
  _TRACE_CTX = _core.trace_ctx  # which trace a draw is made in
except (ImportError, AttributeError):  # another JAX's layout: the init runs as it is
  _random = _TRACE_CTX = None
  _SIGNATURES = {}

# The most elements one pooled draw makes (128 MB of float32): the draw is a temporary of the
# init program, beside the state it fills.
POOL_ELEMENTS = 2**25

_LOCK = threading.RLock()


@dataclasses.dataclass(frozen=True)
class _Draw:
  """One pooled call of the init: its group (distribution and parameters) and its shape."""

  group: tuple
  shape: tuple[int, ...]

  @property
  def size(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64))


def _static(value: Any) -> bool:
  return value is None or isinstance(value, (int, float, str, type, np.dtype, np.generic))


def _describe(name: str, args: tuple, kwargs: dict) -> tuple[_Draw, dict] | None:
  """A call of jax.random's `name` as a _Draw and the parameters to draw its pool with, or None
  where it cannot be pooled (a shape left to its parameters, a parameter that is an array)."""
  try:
    bound = _SIGNATURES[name].bind(None, *args, **kwargs)
  except TypeError:
    return None
  bound.apply_defaults()
  params = dict(bound.arguments)
  del params['key']
  shape = params.pop('shape')
  if shape is None or not all(_static(v) for v in params.values()):
    return None
  try:
    shape = tuple(int(d) for d in shape)
  except TypeError:
    return None
  group = (name,) + tuple(sorted((k, repr(v)) for k, v in params.items()))
  return _Draw(group, shape), params


@contextlib.contextmanager
def _routed(handler: Callable[..., Any]):
  """While the init is traced on this thread, at the level of the trace this is entered in,
  jax.random's poolable draws go to handler(original, draw, params); every other call of them
  (on another thread, inside a vmap or a scan, with array parameters) is made as asked."""
  owner, level = threading.get_ident(), _TRACE_CTX.trace

  def route(name, original):
    def draw(key, *args, **kwargs):
      here = threading.get_ident() == owner and _TRACE_CTX.trace is level
      described = _describe(name, args, kwargs) if here else None
      if described is None:
        return original(key, *args, **kwargs)
      return handler(original, *described)

    return draw

  saved = [(m, n, getattr(m, n)) for m in (jax.random, _random) for n in POOLED]
  with _LOCK:
    for module, name, original in saved:
      setattr(module, name, route(name, original))
    try:
      yield
    finally:
      for module, name, original in saved:
        setattr(module, name, original)


def _plan(init: Callable[[Any], Any], rng: Any) -> list[_Draw]:
  """The init's poolable draws, in the order it makes them."""
  draws: list[_Draw] = []

  def record(original, draw, params):
    draws.append(draw)
    return original(jax.random.key(0), shape=draw.shape, **params)

  def traced(rng):
    with _routed(record):
      return init(rng)

  jax.eval_shape(traced, rng)
  return draws


def _pools(draws: list[_Draw]) -> tuple[list[tuple[int, int]], list[int]]:
  """Each draw's (pool, offset), and each pool's size: the draws of one group fill pools of up
  to POOL_ELEMENTS in order (a draw larger than that has a pool of its own)."""
  where, open_pool, sizes = [], {}, []
  for d in draws:
    p = open_pool.get(d.group)
    if p is None or sizes[p] + d.size > POOL_ELEMENTS:
      p = open_pool[d.group] = len(sizes)
      sizes.append(0)
    where.append((p, sizes[p]))
    sizes[p] += d.size
  return where, sizes


def pooled(init: Callable[[Any], Any]) -> Callable[[Any], Any]:
  """`init(rng)` with its draws pooled (the module's docstring); `init` itself where this JAX
  lacks what the pooling needs."""
  if _random is None:
    return init

  def wrapped(rng):
    draws = _plan(init, rng)
    where, sizes = _pools(draws)
    made: dict[int, Any] = {}
    calls = iter(range(len(draws)))

    def take(original, draw, params):
      i = next(calls, None)
      if i is None or draws[i] != draw:
        raise RuntimeError('the init drew differently when traced a second time')
      p, offset = where[i]
      if p not in made:
        # Computed once into a buffer: without the barrier XLA fuses the distribution's
        # arithmetic into every slice's kernel, a copy of it for each array.
        pool = original(jax.random.fold_in(rng, p), shape=(sizes[p],), **params)
        made[p] = jax.lax.optimization_barrier(pool)
      return made[p][offset : offset + draw.size].reshape(draw.shape)

    with _routed(take):
      state = init(rng)
    if next(calls, None) is not None:
      raise RuntimeError('the init drew differently when traced a second time')
    return state

  return wrapped
