"""Each workload's tiny preset at fp32 with its init, batch and step jitted once a test process:
the tests that start from the tiny state (key 0) and a fixed batch of 2 (key 1) share those
compiles (each some seconds to tens of seconds on one core) instead of each making its own."""

import functools
from typing import Any, Callable, NamedTuple

import jax

from models import precision, registry


class Tiny(NamedTuple):
  cfg: dict[str, Any]
  trainer: Any
  init: Callable  # jitted trainer.init
  make_batch: Callable  # jitted trainer.make_batch, the batch size static
  step: Callable  # jitted trainer.step


@functools.cache
def tiny(name: str) -> Tiny:
  """The workload's tiny fp32 trainer and its jitted functions."""
  w = registry.get(name)
  cfg = w.resolve(tiny=True)
  trainer = w.trainer(cfg, precision.get('fp32'))
  return Tiny(
    cfg,
    trainer,
    jax.jit(trainer.init),
    jax.jit(trainer.make_batch, static_argnums=1),
    jax.jit(trainer.step),
  )


@functools.cache
def start(name: str):
  """(state, batch): the tiny state from key 0 and a batch of 2 from key 1."""
  t = tiny(name)
  return t.init(jax.random.key(0)), t.make_batch(jax.random.key(1), 2)
