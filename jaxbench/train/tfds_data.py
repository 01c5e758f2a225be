"""Real batches for a training run, read through TFDS's random-access data sources.

Each wired workload has a recipe (jaxbench/train/recipes.py): the TFDS dataset its original
trained on and the original's preprocessing. Records are read with `tfds.data_source`
(ArrayRecord files, random access, no TensorFlow), in an order that is a function of the seed
and the position alone, so a resumed run reads the batches an uninterrupted one would. A
background thread prepares the next batches and puts them on the device while the current step
runs. tensorflow-datasets is the optional extra `data`; this module imports it only when a
source is opened.
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import io
import logging
import os
from typing import Any

import numpy as np

from jaxbench.train.recipes import DataError, Example, Recipe

EXTRA = "--data=tfds needs tensorflow-datasets: pip install 'jaxbench[data]'"


def open_records(r: Recipe, data_dir: str | None):
  """The random-access records of r's split ({part: records} for a recipe of parts); DataError
  when tensorflow-datasets is missing or a dataset is not prepared in `data_dir` (TFDS's
  default when None)."""
  if r.parts:
    return {key: open_records(part, data_dir) for key, part in r.parts}
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise DataError(EXTRA) from None
  absl_log = logging.getLogger('absl')
  level = absl_log.level
  # TFDS warns of each folder it finds without the dataset, and prints a banner where a builder's
  # code wants TensorFlow: the line below says what matters once.
  absl_log.setLevel(logging.ERROR)
  try:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
      return tfds.data_source(r.dataset, split=r.split, data_dir=data_dir, download=False)
  except Exception:  # pylint: disable=broad-except  (not found, not built, not ArrayRecord)
    where = data_dir or os.environ.get('TFDS_DATA_DIR') or '~/tensorflow_datasets'
    raise DataError(
      f'--data=tfds: {r.dataset} ({r.split}) is not prepared in {where}: prepare it with '
      f'`tfds build {r.dataset.split(":")[0]} --file_format=array_record --data_dir=DIR` '
      '(TensorFlow needed to build; manual downloads go in DIR/downloads/manual) and pass '
      '--data_dir=DIR'
    ) from None
  finally:
    absl_log.setLevel(level)


class _ReadAhead(abc.ABC):
  """Reads `depth` batches ahead on a thread (`host_batch` of the positions that follow), puts
  each on the device, and hands them out by position."""

  kind = 'tfds'

  def __init__(self, depth: int):
    self.depth = depth
    self._loader = concurrent.futures.ThreadPoolExecutor(1)  # one batch after another
    self._ahead: dict[int, concurrent.futures.Future] = {}

  @abc.abstractmethod
  def host_batch(self, position: int) -> Any:
    """The batch at `position`, in host memory."""

  def _device_batch(self, position: int):
    import jax  # pylint: disable=g-import-not-at-top

    return jax.device_put(self.host_batch(position))

  def batch(self, position: int) -> Any:
    for p in range(position, position + self.depth + 1):
      if p not in self._ahead:
        self._ahead[p] = self._loader.submit(self._device_batch, p)
    for p in [p for p in self._ahead if p < position]:  # a resume elsewhere: not needed
      self._ahead.pop(p).cancel()
    return self._ahead.pop(position).result()

  def close(self) -> None:
    """Stop reading ahead and end the threads; closing twice is harmless."""
    for f in self._ahead.values():
      f.cancel()
    self._loader.shutdown(wait=True, cancel_futures=True)


class Tfds(_ReadAhead):
  """Batches of `examples` records of a TFDS split, shuffled per epoch by `seed` (the data key's
  words), each preprocessed with its own randomness (seed, position, index); `depth` batches
  ahead are prepared on threads and put on the device while the steps run."""

  kind = 'tfds'

  def __init__(self, r: Recipe, cfg, records, examples: int, seed: tuple[int, ...], depth: int = 2):
    super().__init__(depth)
    self.recipe, self.cfg, self.records = r, cfg, records
    self.examples, self.seed = examples, seed
    self.size = len(records)
    if self.size == 0:
      raise DataError(f'--data=tfds: {r.dataset} ({r.split}) has no records')
    self._order: tuple[int, np.ndarray] | None = None
    self._workers = concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1))

  def _record(self, k: int) -> int:
    """The index of the k-th record read: epoch k // size in its own permutation."""
    epoch, i = divmod(k, self.size)
    if self._order is None or self._order[0] != epoch:
      self._order = (epoch, np.random.default_rng([*self.seed, epoch]).permutation(self.size))
    return int(self._order[1][i])

  def host_batch(self, position: int) -> dict[str, np.ndarray]:
    """The batch after `position` batches, as NumPy arrays on the host."""
    first = position * self.examples
    indices = [self._record(first + i) for i in range(self.examples)]

    def one(i: int) -> Example:
      rng = np.random.default_rng([*self.seed, position, i])
      record = self.records[indices[i]]
      if self.recipe.others:
        # Others than the example's own record, where there are others.
        draws = rng.integers(max(self.size - 1, 1), size=self.recipe.others)
        others = [self.records[int(j + (j >= indices[i] and self.size > 1))] for j in draws]
        record = (record, *others)
      return self.recipe.example(record, self.cfg, rng)

    examples = list(self._workers.map(one, range(self.examples)))
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}

  def describe(self, position: int) -> dict[str, Any]:
    """The dataset, and where the next batch comes from: its position and epoch."""
    return {
      'source': self.kind,
      'dataset': self.recipe.dataset,
      'split': self.recipe.split,
      'records': self.size,
      'preprocessing': self.recipe.preprocessing,
      'position': position,
      'epoch': position * self.examples // self.size,
    }

  def close(self) -> None:
    super().close()
    self._workers.shutdown(wait=True, cancel_futures=True)


class Parts(_ReadAhead):
  """One sub-batch of `examples` (times the part's `reads`) per part of the recipe, each read by
  its own `Tfds` (its order seeded by the seed and the part's index): MT-DNN's batch of every
  GLUE task, XLM's English and French streams; the recipe's `combine` makes them one batch."""

  def __init__(self, r: Recipe, cfg, records, examples: int, seed: tuple[int, ...], depth: int = 2):
    super().__init__(depth)
    self.recipe = r
    self.parts = {
      key: Tfds(part, cfg, records[key], examples * part.reads, (*seed, j), depth)
      for j, (key, part) in enumerate(r.parts)
    }

  def host_batch(self, position: int) -> dict[str, Any]:
    batches = {key: part.host_batch(position) for key, part in self.parts.items()}
    return self.recipe.combine(batches) if self.recipe.combine else batches

  def describe(self, position: int) -> dict[str, Any]:
    """The datasets, and where the next batch comes from: its position and each one's epoch."""
    return {
      'source': self.kind,
      'dataset': self.recipe.dataset,
      'split': self.recipe.split,
      'preprocessing': self.recipe.preprocessing,
      'position': position,
      'parts': {key: part.describe(position) for key, part in self.parts.items()},
    }

  def close(self) -> None:
    super().close()
    for part in self.parts.values():
      part.close()


def source(r: Recipe, cfg, records, examples: int, seed: tuple[int, ...]) -> Tfds | Parts:
  """The batches of recipe `r` over `records` (open_records's)."""
  return (Parts if r.parts else Tfds)(r, cfg, records, examples, seed)
