"""A workload's train state as shapes and dtypes at any configuration, allocating nothing: what
the parameter-count tests of the PyTorch peers compare with, at full size."""

import jax

from models import precision, registry


def state(name: str, cfg: dict):
  """jax.eval_shape of the workload's fp32 init at `cfg`."""
  trainer = registry.get(name).trainer(cfg, precision.get('fp32'))
  return jax.eval_shape(trainer.init, jax.random.key(0))
