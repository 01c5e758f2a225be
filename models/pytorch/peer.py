"""The PyTorch peer contract: a workload's PyTorch version, trained as the JAX workload is.

A peer has the name of a JAX workload (models/registry.py) and takes that workload's resolved
config, so the two train the same model at the same size: the same batch shapes and
distributions, the same loss and the same optimizer (so the optimizer state has the same size).
The harness (jaxbench/pytorch/) owns everything that is not the model: the device, precision
(TF32 switches, autocast, the gradient scaler), torch.compile, the search and the timing.

A peer builds its networks in float32 on the device it is given (`torch.device('meta')` counts
parameters without allocating them) and describes one training iteration as a list of
`Update`s, which the harness applies in order: each is one loss, one backward and one optimizer
step. A supervised model has one; mt_dnn has one per task; a GAN one for the discriminator and
one for the generator, its EMA in `after_step`.
"""

import contextlib
import dataclasses
from typing import Any, Callable, ContextManager, Mapping

import torch

Config = Mapping[str, Any]
Batch = Any


@dataclasses.dataclass
class Update:
  """One loss and the optimizer step it feeds.

  loss(batch, step) -> scalar float32 tensor: the forward pass and the loss, run by the harness
    under the precision's autocast (and, with --torch_compile, compiled). `step` is the
    iteration's index (for per-step randomness a peer draws from a seeded generator).
  optimizer: steps the parameters this loss trains.
  clip_norm: the global gradient norm clipped to before the step (None: no clipping); the
    harness unscales the gradients first under a gradient scaler.
  """

  loss: Callable[[Batch, int], torch.Tensor]
  optimizer: torch.optim.Optimizer
  clip_norm: float | None = None


@dataclasses.dataclass
class Setup:
  """A peer built at one config on one device.

  modules: the named networks (their parameters are counted, per name and in total, as the JAX
    workload's param_groups are); every trainable parameter belongs to one of them.
  updates: one training iteration, in order.
  after_step: run after the iteration's updates, outside autocast (an EMA of the weights).
  """

  modules: dict[str, torch.nn.Module]
  updates: list[Update]
  after_step: Callable[[], None] | None = None

  def param_count(self) -> int:
    seen = {id(p): p for m in self.modules.values() for p in m.parameters()}
    return sum(p.numel() for p in seen.values())


@dataclasses.dataclass(frozen=True)
class Peer:
  """The PyTorch version of one JAX workload.

  name: the JAX workload's name; its config, tiny preset, batch unit and throughput unit are
    this peer's too.
  build(cfg, device) -> Setup: the networks and optimizers, parameters in float32 on `device`.
  make_batch(cfg, n, generator, device) -> batch: n examples drawn as the JAX workload's
    make_batch draws them (same shapes, dtypes and distributions), with `generator` (a
    torch.Generator on `device`) so that a seed gives the same batch.
  source: what the peer is built from, in a few words (the library models it uses and what is
    written by hand), for the record and the docs.
  differences: how the peer differs from the JAX workload where it must, in a few words each
    (empty: none); the tests check the parameter counts, this says why any differ.
  loss_scale: under fp16, the gradient scaler's start and the finite steps between doublings
    where the JAX workload's differ from the policy's (models/precision.py), as
    {'init': ..., 'window': ...}; None: the policy's.
  compiled: the modules that --torch_compile compiles, each a name in the Setup's `modules` and
    optionally a submodule's path in it ('mask_rcnn.backbone'), where compiling each update's
    loss (None, the default) does worse: mt_dnn's eight task losses share its encoder, and
    Dynamo, guarding on each loss's task, compiled the encoder's forward and backward passes
    once per task; Mask R-CNN's heads have shapes that follow the data, on which Dynamo breaks
    its graph and recompiles. Results record it (`peer.compiled`).
  """

  name: str
  build: Callable[[Config, torch.device], Setup]
  make_batch: Callable[[Config, int, torch.Generator, torch.device], Batch]
  source: str
  differences: tuple[str, ...] = ()
  loss_scale: Mapping[str, float] | None = None
  compiled: tuple[str, ...] | None = None


def run_updates(
  setup: Setup,
  batch: Batch,
  step: int,
  autocast: Callable[[], ContextManager] = contextlib.nullcontext,
  scaler: 'torch.amp.GradScaler | None' = None,
) -> torch.Tensor:
  """One training iteration: each update's loss under `autocast`, its backward (scaled by
  `scaler` where given), clipping and optimizer step, then `after_step`. Returns the last
  update's loss, detached (the harness checks it is finite without a device sync per step)."""
  loss = None
  for update in setup.updates:
    update.optimizer.zero_grad(set_to_none=True)
    with autocast():
      loss = update.loss(batch, step)
    if scaler is None:
      loss.backward()
    else:
      scaler.scale(loss).backward()
    if update.clip_norm is not None:
      if scaler is not None:
        scaler.unscale_(update.optimizer)
      params = [p for group in update.optimizer.param_groups for p in group['params']]
      torch.nn.utils.clip_grad_norm_(params, update.clip_norm)
    if scaler is None:
      update.optimizer.step()
    else:
      scaler.step(update.optimizer)
      scaler.update()
  if setup.after_step is not None:
    with torch.no_grad():
      setup.after_step()
  return loss.detach()
