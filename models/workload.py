"""The workload contract: each 2020 benchmark model is one frozen `Workload`.

A model file (models/*.py) exports `Workload` instances. The harness only ever
talks to a workload through `Workload.trainer(config, policy)`, which returns a
`Trainer`: three pure functions the harness jits itself. Most workloads are
plain supervised models and get their trainer from `supervised(...)`; GANs and
other multi-step iterations write their own `Trainer` (the escape hatch) and
the harness still jits and donates it the same way.
"""

import ast
import dataclasses
import json
import math
import types
from typing import Any, Callable, Mapping, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models import precision

Config = Mapping[str, Any]
Batch = Any
State = Any
Metrics = Mapping[str, jax.Array]


class Trainer(NamedTuple):
  """The three pure functions of a workload at one config and precision.

  init(rng) -> state: parameters, model state and optimizer state.
  make_batch(rng, n) -> batch: a synthetic batch of `n` examples, built on
    the device; `n` is static.
  step(state, batch, rng) -> (state, metrics): one training iteration. It
    derives per-step randomness from `rng` and its own step counter, so the
    harness can pass the same key every step and move nothing from the host.
    `metrics['loss']` is the scalar the harness checks for finiteness.
  The state's trained parameters are its `params` attribute (or key).
  """

  init: Callable[[jax.Array], State]
  make_batch: Callable[[jax.Array, int], Batch]
  step: Callable[[State, Batch, jax.Array], tuple[State, Metrics]]
  # Optional: named sub-networks to count separately (e.g. generator, discriminator).
  param_groups: Callable[[State], Mapping[str, Any]] | None = None


def _one(cfg: Config) -> int:
  del cfg
  return 1


def _no_check(cfg: Config) -> None:
  del cfg
  return None


@dataclasses.dataclass(frozen=True)
class Key:
  """What one config key accepts. Its type is its default's: bool, int, float, str, or a tuple
  of these (nested tuples too, e.g. (width, kernel) pairs), each number checked alone.

  Without a Key a number must be at least 1 (an int: a size, a count) or at least 0 and finite
  (a float), and a tuple keeps its default's length. `lo`/`hi` bound a number inclusively,
  `above`/`below` exclusively; `choices` lists the values a key takes; `sized=False` lets a
  tuple take any length of one or more; `kind=float` takes numbers where the default has ints.
  """

  lo: float | None = None
  hi: float | None = None
  above: float | None = None
  below: float | None = None
  choices: tuple = ()
  sized: bool = True
  kind: type | None = None  # the numbers' type where the default's is not it (float for int)

  def allows(self, x: float) -> bool:
    lo = self.lo if self.lo is not None or self.above is not None else _DEFAULT_LO[type(x)]
    return not (
      (lo is not None and x < lo)
      or (self.hi is not None and x > self.hi)
      or (self.above is not None and x <= self.above)
      or (self.below is not None and x >= self.below)
    )

  def describe(self, kind: type) -> str:
    """The numbers allowed, in words: 'an integer at least 1'."""
    lo = self.lo if self.lo is not None or self.above is not None else _DEFAULT_LO[kind]
    bounds = [
      f'at least {_num(lo)}' if lo is not None else '',
      f'above {_num(self.above)}' if self.above is not None else '',
      f'below {_num(self.below)}' if self.below is not None else '',
      f'at most {_num(self.hi)}' if self.hi is not None else '',
    ]
    what = 'an integer' if kind is int else 'a finite number'
    bounds = [b for b in bounds if b]
    return f'{what} {" and ".join(bounds)}' if bounds else what


_DEFAULT_LO = {int: 1, float: 0.0}
# The ranges most keys other than sizes and counts take.
NATURAL = Key(lo=0)  # an int that may be 0: steps of a warm-up, ...
FRACTION = Key(lo=0, below=1)  # a dropout rate, ...
PROBABILITY = Key(lo=0, hi=1)


def first(*problems: tuple[bool, str]) -> str | None:
  """The first broken constraint of a `check`: its words where its condition holds, else None."""
  return next((text for broken, text in problems if broken), None)


_BOOLS = {'true': True, '1': True, 'false': False, '0': False}


def _num(x: float) -> str:
  return str(int(x)) if float(x).is_integer() else str(x)


def _plural(default: Any, kind: type | None) -> str:
  if isinstance(default, tuple):
    return f'lists of {_plural(default[0], kind)}'
  return {bool: 'booleans', int: 'integers', float: 'numbers', str: 'strings'}[
    kind or type(default)
  ]


def _shape(default: tuple, key: 'Key') -> str:
  """A tuple default's type in words: 'a list of integers', 'a list of lists of numbers'."""
  return f'a list of {_plural(default[0], key.kind)}'


def parse(default: Any, key: Key, value: Any) -> Any:
  """`value` (the text of --set, or a value) as the type of `default`; ValueError if it is not
  one, or lies outside `key`'s range. Lists parse from `[3,4,6,3]` or `3,4,6,3`."""
  if isinstance(value, str) and isinstance(default, tuple):
    text = value.strip()
    try:
      value = ast.literal_eval(text if text[:1] in '[(' else f'[{text}]')
    except (ValueError, SyntaxError, MemoryError, RecursionError):
      raise ValueError(f'is not {_shape(default, key)}') from None
  return _value(default, key, value)


def _value(default: Any, key: Key, value: Any) -> Any:
  kind = type(default) if isinstance(default, (tuple, str, bool)) else key.kind or type(default)
  if kind is bool:
    text = str(value).strip().lower()
    if text not in _BOOLS:
      raise ValueError('must be true or false (or 1 or 0)')
    return _BOOLS[text]
  if kind is str:
    value = str(value)
  elif kind is tuple:
    if not isinstance(value, (list, tuple)) or not value:
      raise ValueError(f'must be {_shape(default, key)}, not empty')
    if key.sized and len(value) != len(default):
      raise ValueError(f'must be {_shape(default, key)} of length {len(default)}')
    inner = dataclasses.replace(key, sized=True)
    return tuple(_value(default[min(i, len(default) - 1)], inner, v) for i, v in enumerate(value))
  elif kind in (int, float):
    if isinstance(value, str):
      try:
        value = kind(value.strip())
      except ValueError:
        raise ValueError(f'must be {key.describe(kind)}') from None
    if (
      isinstance(value, bool)
      or not isinstance(value, (int, float))
      or not math.isfinite(value)
      or (kind is int and value != int(value))
      or not key.allows(kind(value))
    ):
      raise ValueError(f'must be {key.describe(kind)}')
    value = kind(value)
  if key.choices and value not in key.choices:
    raise ValueError(f'must be one of {", ".join(map(str, key.choices))}')
  return value


@dataclasses.dataclass(frozen=True)
class Workload:
  """One benchmark workload: its 2020 configuration and how to train it.

  The batch is searched in whole examples (an image, a sequence, a sentence);
  `example_size` converts examples to the batch unit (e.g. a sentence of
  fixed length is that many tokens of max_tokens), `units_per_example` to the
  throughput unit (e.g. target tokens), `flops_per_example` counts the
  training FLOPs (forward and backward) analytically.
  """

  name: str
  description: str
  unit: str  # what the batch counts: 'images', 'sequences', 'tokens'
  throughput_unit: str  # e.g. 'images/s', 'target tokens/s'
  config: Config
  tiny: Config  # overrides of `config` for the test-size preset
  trainer: Callable[[Config, precision.Policy], Trainer]
  flops_per_example: Callable[[Config], float]
  example_size: Callable[[Config], int] = _one
  units_per_example: Callable[[Config], float] = _one
  default_precision: str = 'fp32'
  family: str = 'language'  # 'image' or 'language'
  # GANs: the combined loss of two competing networks need not fall on a fixed
  # batch; their own tests check each network's loss with the other frozen.
  adversarial: bool = False
  # The batches the workload runs: any number of examples below this, else a multiple of it.
  # fairseq's --required-batch-size-multiple (8 by default): a batch of sentences under
  # --max-tokens is cut to a multiple of 8, so the max-batch search probes only those.
  batch_multiple: int = 1
  # Raised when the same configuration's compiled program changes (and with it its memory):
  # results record it, and --search_hints takes forecasts only from the same revision.
  revision: int = 1
  # What each config key accepts where it is more than its type's default range (see Key).
  spec: Mapping[str, Key] = dataclasses.field(default_factory=dict)
  # What the keys must satisfy together (heads divide the width, ...): the broken constraint
  # in words, or None. resolve checks it after each key alone.
  check: Callable[[Config], str | None] = _no_check

  def __post_init__(self):
    object.__setattr__(self, 'config', types.MappingProxyType(dict(self.config)))
    object.__setattr__(self, 'tiny', types.MappingProxyType(dict(self.tiny)))
    for what, keys, known in (
      ('tiny preset', self.tiny, self.config),
      ('spec', self.spec, self.config),
    ):
      unknown = set(keys) - set(known)
      if unknown:
        raise ValueError(f'{self.name}: {what} names unknown keys {sorted(unknown)}')

  def resolve(self, tiny: bool = False, overrides: Config | None = None) -> dict[str, Any]:
    """The configuration to run: full size or the tiny preset, plus overrides, each parsed as
    its key's type and checked against its range, then the keys together (`check`).

    Raises ValueError with one line that names the key, the value and what is allowed.
    """
    cfg = dict(self.config)
    if tiny:
      cfg.update(self.tiny)
    overrides = dict(overrides or {})
    for key, value in overrides.items():
      if key not in self.config:
        keys = ', '.join(sorted(self.config))
        raise ValueError(f'{self.name} has no config key {key!r}; keys: {keys}')
      cfg[key] = value
    for key, value in cfg.items():
      try:
        cfg[key] = parse(self.config[key], self.spec.get(key, Key()), value)
      except ValueError as e:
        raise ValueError(f'{self.name}: {key} {e}, got {_text(value)}') from None
    problem = self.check(cfg)
    if problem:
      given = ', '.join(f'{k}={_text(v)}' for k, v in overrides.items())
      raise ValueError(f'{self.name}: {problem}' + (f' (given {given})' if given else ''))
    return cfg


def _text(value: Any) -> str:
  """A value as the user wrote it or would: lists in brackets, without spaces."""
  if isinstance(value, str):
    return value
  return json.dumps(value, separators=(',', ':')) if isinstance(value, tuple) else str(value)


@flax.struct.dataclass
class TrainState:
  """The state of a supervised workload."""

  step: jax.Array
  params: Any
  model_state: Any  # non-trainable collections, e.g. batch-norm statistics
  opt_state: Any
  loss_scale: Any  # flax DynamicScale under fp16, else None

  @classmethod
  def create(
    cls, params, tx: optax.GradientTransformation, policy: precision.Policy, model_state=None
  ) -> 'TrainState':
    """Step 0: fresh optimizer state and the policy's initial loss scale."""
    return cls(
      step=jnp.zeros((), jnp.int32),
      params=params,
      model_state={} if model_state is None else model_state,
      opt_state=tx.init(params),
      loss_scale=policy.initial_scale(),
    )


def supervised(
  model: Callable[[Config, Any], nn.Module],
  make_batch: Callable[[Config, jax.Array, int], Batch],
  loss: Callable[[Config, Any, Batch], tuple[jax.Array, Metrics]],
  optimizer: Callable[[Config], optax.GradientTransformation],
) -> Callable[[Config, precision.Policy], Trainer]:
  """The trainer of a model trained with one loss and one optimizer.

  model(config, dtype): a Flax module called as `module(batch, train=...)`;
    every stochastic layer draws from the 'dropout' rng stream.
  make_batch(config, rng, n): the synthetic batch.
  loss(config, outputs, batch): (scalar float32 loss, metrics).
  optimizer(config): the optax transformation, weight decay included.
  """

  def trainer(cfg: Config, policy: precision.Policy) -> Trainer:
    module = model(cfg, policy.compute_dtype)
    tx = optimizer(cfg)

    def init(rng):
      params_rng, dropout_rng, batch_rng = jax.random.split(rng, 3)
      batch = make_batch(cfg, batch_rng, 1)
      variables = module.init({'params': params_rng, 'dropout': dropout_rng}, batch, train=False)
      params = variables.pop('params')
      return TrainState.create(params, tx, policy, model_state=variables)

    def step(state, batch, rng):
      rng = jax.random.fold_in(rng, state.step)
      mutable = list(state.model_state)

      def loss_fn(params):
        variables = {'params': params, **state.model_state}
        if mutable:
          outputs, new_model_state = module.apply(
            variables, batch, train=True, rngs={'dropout': rng}, mutable=mutable
          )
        else:
          outputs = module.apply(variables, batch, train=True, rngs={'dropout': rng})
          new_model_state = state.model_state
        value, metrics = loss(cfg, outputs, batch)
        return value, (new_model_state, metrics)

      if state.loss_scale is None:
        (value, (model_state, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          state.params
        )
        finite, loss_scale = None, None
      else:
        loss_scale, finite, (value, (model_state, metrics)), grads = (
          state.loss_scale.value_and_grad(loss_fn, has_aux=True)(state.params)
        )
      updates, opt_state = tx.update(grads, state.opt_state, state.params)
      params = optax.apply_updates(state.params, updates)
      if finite is not None:
        # A step whose scaled gradients overflowed changes nothing but the scale.
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
        model_state = keep(model_state, state.model_state)
      new_state = TrainState(
        step=state.step + 1,
        params=params,
        model_state=model_state,
        opt_state=opt_state,
        loss_scale=loss_scale,
      )
      return new_state, {'loss': value, **metrics}

    return Trainer(init=init, make_batch=lambda rng, n: make_batch(cfg, rng, n), step=step)

  return trainer


def count_params(tree: Any) -> int:
  return int(sum(x.size for x in jax.tree.leaves(tree)))


def param_counts(trainer: Trainer, state: State) -> dict[str, int]:
  """Exact parameter counts: the total, and each network's for multi-network workloads."""
  params = state['params'] if isinstance(state, Mapping) else state.params
  counts = {'total': count_params(params)}
  if trainer.param_groups is not None:
    counts.update({name: count_params(tree) for name, tree in trainer.param_groups(state).items()})
  return counts
