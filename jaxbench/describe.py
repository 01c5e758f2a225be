"""--list_models and --describe: what each workload is, without running it."""

import json

import jax

from models import precision
from models import workload as wl


def list_line(w: wl.Workload) -> str:
  return f'{w.name:<16} {w.unit:<10} {w.description}'


def describe(w: wl.Workload, tiny: bool = False, overrides=None) -> str:
  """One JSON object: exact parameter counts from jax.eval_shape (nothing is allocated)."""
  cfg = w.resolve(tiny=tiny, overrides=overrides)
  trainer = w.trainer(cfg, precision.get(w.default_precision))
  shapes = jax.eval_shape(lambda: trainer.init(jax.random.key(0)))
  counts = wl.param_counts(trainer, shapes)
  return json.dumps(
    {
      'name': w.name,
      'description': w.description,
      'family': w.family,
      'unit': w.unit,
      'throughput_unit': w.throughput_unit,
      'default_precision': w.default_precision,
      'params': counts['total'],
      'param_groups': {k: v for k, v in counts.items() if k != 'total'},
      'example_size': w.example_size(cfg),
      # The batches it runs: any number of examples below this, else its multiples.
      'batch_multiple': w.batch_multiple,
      'units_per_example': w.units_per_example(cfg),
      'flops_per_example': w.flops_per_example(cfg),
      'tiny': tiny,
      'config': dict(cfg),
    },
    sort_keys=False,
  )
