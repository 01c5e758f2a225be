"""Precision policies: fp32, tf32, bf16 and fp16 with dynamic loss scaling."""

import dataclasses
from typing import Any

import jax.numpy as jnp
from flax.training import dynamic_scale


@dataclasses.dataclass(frozen=True)
class Policy:
  """How a workload computes: activation dtype, matmul precision, loss scaling.

  Parameters and optimizer state stay float32 under every policy (master
  weights); `compute_dtype` is what the layers run in.
  """

  name: str
  compute_dtype: Any
  # Passed to jax.default_matmul_precision while the step is traced: 'float32'
  # forbids tensor-float32 on matmuls and convolutions; 'tensorfloat32' is the
  # GPU default for float32 inputs.
  matmul_precision: str
  loss_scaling: bool
  description: str
  # The dynamic loss scale's start and the finite steps between doublings (halved on any
  # overflow). TensorFlow's defaults (Keras' LossScaleOptimizer: 2**15, every 2000 steps) serve
  # the workloads whose reference named none; a workload whose 2020 run used other values states
  # them with `with_loss_scale` (transformer_big: fairseq's).
  loss_scale_init: float = 2.0**15
  loss_scale_window: int = 2000

  def with_loss_scale(self, init: float, window: int) -> 'Policy':
    """This policy with a workload's own initial loss scale and growth window."""
    return dataclasses.replace(self, loss_scale_init=init, loss_scale_window=window)

  def initial_scale(self) -> dynamic_scale.DynamicScale | None:
    """The dynamic loss scale a fresh train state starts with (fp16 only)."""
    if not self.loss_scaling:
      return None
    return dynamic_scale.DynamicScale(
      growth_factor=2.0,
      backoff_factor=0.5,
      growth_interval=self.loss_scale_window,
      fin_steps=jnp.int32(0),
      scale=jnp.float32(self.loss_scale_init),
    )


POLICIES = {
  'fp32': Policy(
    'fp32', jnp.float32, 'float32', False, 'float32 everywhere, full-precision matmuls (no TF32)'
  ),
  'tf32': Policy(
    'tf32',
    jnp.float32,
    'tensorfloat32',
    False,
    'float32 storage, TF32 matmuls and convolutions (JAX GPU default)',
  ),
  'bf16': Policy(
    'bf16', jnp.bfloat16, 'default', False, 'bfloat16 compute, float32 master weights'
  ),
  'fp16': Policy(
    'fp16',
    jnp.float16,
    'default',
    True,
    'float16 compute, float32 master weights, dynamic loss scaling',
  ),
}


def get(name: str) -> Policy:
  try:
    return POLICIES[name]
  except KeyError:
    raise ValueError(f'unknown precision {name!r}; valid: {", ".join(POLICIES)}') from None
