"""The PyTorch peer of transformer_big trains what the JAX workload trains: the same parameter
count, batch, loss and learning-rate schedule, and it learns on a fixed batch."""

import jax
import jax.numpy as jnp
import numpy as np
import torch

from models import registry
from models import transformer as jax_transformer
from models import workload as wl
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry
from models.pytorch import transformer
from tests import shapes

NAME = 'transformer_big'


def test_full_size_parameter_count_equals_jax():
  w = registry.get(NAME)
  cfg = w.resolve()
  state = shapes.state(NAME, cfg)
  setup = peer_registry.get(NAME).build(cfg, torch.device('meta'))
  assert setup.param_count() == wl.count_params(state.params) == 209_911_808
  assert peer_registry.get(NAME).differences == ()


def test_batch_has_the_jax_shapes_dtypes_and_values():
  cfg = registry.get(NAME).resolve(tiny=True)
  jax_batch = jax_transformer.make_batch(cfg, jax.random.key(0), 5)
  batch = transformer.make_batch(cfg, 5, torch.Generator().manual_seed(0), torch.device('cpu'))
  assert set(batch) == set(jax_batch)
  for key, value in batch.items():
    assert tuple(value.shape) == jax_batch[key].shape, key
    assert str(value.dtype).removeprefix('torch.') == str(jax_batch[key].dtype), key
  for key in ('source', 'target'):
    assert 1 <= int(batch[key].min()) and int(batch[key].max()) < cfg['vocab']
  assert (batch['target_in'][:, 0] == 2).all()
  assert (batch['target_in'][:, 1:] == batch['target'][:, :-1]).all()


def test_loss_and_positions_equal_jax():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 11)).astype(np.float32)
  targets = rng.integers(0, 11, size=(2, 5)).astype(np.int32)
  weights = (rng.random((2, 5)) > 0.3).astype(np.float32)
  want, _ = jax_transformer.label_smoothed_nll(logits, targets, 0.1, weights)
  got = transformer.label_smoothed_nll(
    torch.from_numpy(logits), torch.from_numpy(targets), 0.1, torch.from_numpy(weights)
  )
  np.testing.assert_allclose(got.item(), float(want), rtol=1e-6)
  np.testing.assert_allclose(
    transformer.sinusoidal_positions(7, 16, 'cpu').numpy(),
    np.asarray(jax_transformer.sinusoidal_positions(7, 16)),
    rtol=1e-6,
    atol=1e-6,
  )


def test_learning_rate_follows_the_jax_schedule():
  cfg = dict(registry.get(NAME).resolve(tiny=True), warmup=4)
  setup = transformer.build(cfg, torch.device('cpu'))
  optimizer = setup.updates[0].optimizer
  want = jax_transformer.inverse_sqrt(cfg['lr'], cfg['warmup'])
  batch = transformer.make_batch(cfg, 2, torch.Generator().manual_seed(0), torch.device('cpu'))
  for step in range(6):
    np.testing.assert_allclose(optimizer.param_groups[0]['lr'], float(want(jnp.int32(step))))
    peer_lib.run_updates(setup, batch, step)


def test_one_iteration_then_the_loss_falls_on_a_fixed_batch():
  torch.manual_seed(0)
  cfg = registry.get(NAME).resolve(tiny=True)
  setup = peer_registry.get(NAME).build(cfg, torch.device('cpu'))
  assert set(setup.modules) == {'transformer'}
  batch = transformer.make_batch(cfg, 8, torch.Generator().manual_seed(1), torch.device('cpu'))
  losses = [peer_lib.run_updates(setup, batch, step).item() for step in range(12)]
  assert np.isfinite(losses).all()
  assert losses[-1] < 0.8 * losses[0], losses
