"""Where a training run's batches come from: a stream whose whole state is its position.

The loop asks `batch(position)` for the batch of the step that follows `position` steps and
saves the position with the checkpoint, so a resumed run sees the batches an uninterrupted one
would. `--data=tfds` reads a dataset through TFDS instead (jaxbench/train/tfds_data.py), with
the same members.
"""

from collections.abc import Callable
from typing import Any

import jax

KINDS = ('synthetic', 'tfds')  # --data


class Synthetic:
  """The workload's synthetic batches, each drawn from `key` folded with its position, built
  on the device by one jitted function (the position is an argument: one compile)."""

  kind = 'synthetic'

  def __init__(self, make_batch: Callable[[jax.Array, int], Any], key: jax.Array, examples: int):
    self.key = key
    self._batch = jax.jit(lambda k, p: make_batch(jax.random.fold_in(k, p), examples))

  def batch(self, position: int) -> Any:
    return self._batch(self.key, position)

  def describe(self, position: int) -> dict[str, Any]:
    """What the result records of the source: its kind and where the next batch comes from."""
    return {'source': self.kind, 'position': position}

  def close(self) -> None:
    """Nothing to release: the batches are built on demand."""
