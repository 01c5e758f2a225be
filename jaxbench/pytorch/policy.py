"""The precision policies (models/precision.py) as PyTorch sets them: TF32 switches, autocast and
a gradient scaler, parameters and optimizer state in float32 under every one (master weights).

fp32: TF32 off for matmuls and cuDNN convolutions, no autocast. tf32: TF32 on. bf16 and fp16:
autocast to bfloat16 or float16, TF32 on for what stays float32 (as JAX's 'default' matmul
precision allows it on the GPU); fp16 with a gradient scaler whose settings are the JAX policy's
dynamic loss scale (2**15, halved on overflow, doubled after 2000 finite steps, or the
workload's own: transformer_big's is fairseq's, 2**7 and 2**14 steps). cudnn.benchmark
is on under every policy: cuDNN times its algorithms for each new shape, as XLA autotunes.
"""

import contextlib
import dataclasses
import functools
from typing import Callable, ContextManager, Mapping

import torch

from models import precision


@dataclasses.dataclass(frozen=True)
class Policy:
  name: str
  tf32: bool
  autocast_dtype: torch.dtype | None  # None: no autocast
  loss_scaling: bool


POLICIES = {
  'fp32': Policy('fp32', False, None, False),
  'tf32': Policy('tf32', True, None, False),
  'bf16': Policy('bf16', True, torch.bfloat16, False),
  'fp16': Policy('fp16', True, torch.float16, True),
}


def get(name: str) -> Policy:
  try:
    return POLICIES[name]
  except KeyError:
    raise ValueError(f'unknown precision {name!r}; valid: {", ".join(POLICIES)}') from None


def apply(policy: Policy) -> None:
  """Set the process-wide switches the policy decides (TF32, cuDNN's autotuning)."""
  torch.backends.cuda.matmul.allow_tf32 = policy.tf32
  torch.backends.cudnn.allow_tf32 = policy.tf32
  torch.backends.cudnn.benchmark = True


def autocast(policy: Policy, device: torch.device) -> Callable[[], ContextManager]:
  """The context each update's loss runs in (peer.run_updates' `autocast`)."""
  if policy.autocast_dtype is None:
    return contextlib.nullcontext
  return functools.partial(torch.autocast, device_type=device.type, dtype=policy.autocast_dtype)


def scaler(
  policy: Policy, device: torch.device, loss_scale: Mapping[str, float] | None = None
) -> 'torch.amp.GradScaler | None':
  """A fresh gradient scaler for fp16 (one per trial, as each trial starts a fresh state):
  the JAX policy's loss scale (models/precision.Policy), or a workload's own `loss_scale`
  ({'init', 'window'}: its start and the finite steps between doublings)."""
  if not policy.loss_scaling:
    return None
  default = precision.get(policy.name)
  own = loss_scale or {}
  return torch.amp.GradScaler(
    device.type,
    init_scale=float(own.get('init', default.loss_scale_init)),
    growth_factor=2.0,
    backoff_factor=0.5,
    growth_interval=int(own.get('window', default.loss_scale_window)),
  )
