"""The workload contract: each 2020 benchmark model is one frozen `Workload`.

A model file (models/*.py) exports `Workload` instances. The harness only ever
talks to a workload through `Workload.trainer(config, policy)`, which returns a
`Trainer`: three pure functions the harness jits itself. Most workloads are
plain supervised models and get their trainer from `supervised(...)`; GANs and
other multi-step iterations write their own `Trainer` (the escape hatch) and
the harness still jits and donates it the same way.
"""

import dataclasses
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
  # Raised when the same configuration's compiled program changes (and with it its memory):
  # results record it, and --search_hints takes forecasts only from the same revision.
  revision: int = 1
  # Config keys that take one of a few values: key -> the allowed values (checked by resolve).
  choices: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
  # Build the initial state op by op on the host CPU instead of as one jitted program (see
  # program.Program.initial_state): for models whose jitted init takes minutes to compile.
  eager_init: bool = False

  def __post_init__(self):
    object.__setattr__(self, 'config', types.MappingProxyType(dict(self.config)))
    object.__setattr__(self, 'tiny', types.MappingProxyType(dict(self.tiny)))
    unknown = set(self.tiny) - set(self.config)
    if unknown:
      raise ValueError(f'{self.name}: tiny preset sets unknown keys {sorted(unknown)}')

  def resolve(self, tiny: bool = False, overrides: Config | None = None) -> dict[str, Any]:
    """The configuration to run: full size or the tiny preset, plus overrides."""
    cfg = dict(self.config)
    if tiny:
      cfg.update(self.tiny)
    for key, value in (overrides or {}).items():
      if key not in cfg:
        raise ValueError(f'{self.name} has no config key {key!r}; keys: {", ".join(sorted(cfg))}')
      cfg[key] = type(cfg[key])(value) if cfg[key] is not None else value
    for key, allowed in self.choices.items():
      if cfg[key] not in allowed:
        options = ', '.join(allowed)
        raise ValueError(f'{self.name}: {key} must be one of {options}, got {cfg[key]!r}')
    return cfg


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
