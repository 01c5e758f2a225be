"""The PyTorch peer of nasnet_large: timm's nasnetalarge with the JAX workload's parameters,
batch, drop-path schedule, weight decay and loss, and it learns on a fixed batch."""

import collections

import jax
import numpy as np
import pytest
import timm
import torch

from models import registry
from models import workload as wl
from models.nasnet import nasnet as jax_nasnet
from models.pytorch import nasnet
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry
from tests import shapes

NAME = 'nasnet_large'
CPU = torch.device('cpu')


pytestmark = pytest.mark.usefixtures('torch_one_thread')


def _jax_parts(cfg):
  """The JAX workload's trainable parameters per top-level part, named as timm names them."""
  params = shapes.state(NAME, cfg).params
  parts = {k: wl.count_params(v) for k, v in params.items()}
  parts['conv0'] += parts.pop('conv0_bn')
  parts['last_linear'] = parts.pop('logits')
  return parts


def _peer_parts(model):
  parts = collections.Counter()
  for name, p in model.net.named_parameters():
    parts[name.split('.')[0]] += p.numel()
  return dict(parts)


@pytest.mark.slow
def test_full_size_is_timms_nasnetalarge_with_the_jax_parameter_count():
  cfg = registry.get(NAME).resolve()
  setup = peer_registry.get(NAME).build(cfg, torch.device('meta'))
  model = setup.modules['nasnet']
  with torch.device('meta'):
    reference = timm.create_model('nasnetalarge', num_classes=1001, pretrained=False)
  torch_shapes = lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()}
  assert torch_shapes(model.net) == torch_shapes(reference)
  # Part by part (conv0, the stem cells, each cell, the classifier) as the JAX workload's.
  assert _peer_parts(model) == _jax_parts(cfg)
  assert setup.param_count() == 88_757_183


def test_tiny_layout_differs_from_jax_only_where_timms_cell_has_a_fixed_1x1():
  """The tiny preset's one cell per stack puts reduction_cell_0 on the second stem cell's
  output, whose width (16) is already the reduction's: slim (and JAX) then skip the 1x1
  convolution on that input; timm's reduction cell always has it (16x16 + batch norm 2x16)."""
  cfg = registry.get(NAME).resolve(tiny=True)
  peer_parts, jax_parts = _peer_parts(nasnet.NASNet(cfg)), _jax_parts(cfg)
  assert set(peer_parts) == set(jax_parts)
  differ = {k for k in jax_parts if peer_parts[k] != jax_parts[k]}
  assert differ == {'reduction_cell_0'}
  assert peer_parts['reduction_cell_0'] - jax_parts['reduction_cell_0'] == 16 * 16 + 2 * 16


def test_forward_is_timms_wiring():
  """At timm's 18-cell layout the peer's forward computes what timm's own forward does."""
  cfg = dict(registry.get(NAME).resolve(tiny=True), num_cells=18)
  torch.manual_seed(0)
  model = nasnet.NASNet(cfg).eval()
  images = nasnet.make_batch(cfg, 2, torch.Generator().manual_seed(0), CPU)['images']
  with torch.no_grad():
    torch.testing.assert_close(model(images), model.net(images), rtol=0, atol=0)


def test_batch_has_the_jax_shapes_dtypes_and_distribution():
  cfg = registry.get(NAME).resolve(tiny=True)
  want = jax_nasnet.make_batch(cfg, jax.random.key(0), 8)
  batch = nasnet.make_batch(cfg, 8, torch.Generator().manual_seed(0), CPU)
  n, h, w, c = want['images'].shape
  assert tuple(batch['images'].shape) == (n, c, h, w)  # NCHW
  assert batch['images'].dtype == torch.float32 and want['images'].dtype == np.float32
  assert tuple(batch['labels'].shape) == want['labels'].shape
  assert batch['labels'].dtype == torch.int32 and want['labels'].dtype == np.int32
  images = batch['images'].numpy()
  assert images.min() >= -1.0 and images.max() <= 1.0
  assert abs(images.std() - float(np.std(want['images']))) < 0.005
  assert abs(images.mean()) < 0.005
  assert 0 <= int(batch['labels'].min()) and int(batch['labels'].max()) < cfg['num_classes']


def test_drop_path_follows_the_schedule_in_training_only():
  cfg = dict(registry.get(NAME).resolve(tiny=True), drop_path_steps=4, dense_dropout=0.0)
  torch.manual_seed(0)
  setup = nasnet.build(cfg, CPU)
  model = setup.modules['nasnet']
  images = nasnet.make_batch(cfg, 4, torch.Generator().manual_seed(0), CPU)['images']
  with torch.no_grad():
    # Step 0: no progress, nothing dropped (batch norm in training is deterministic too).
    torch.testing.assert_close(model(images), model(images), rtol=0, atol=0)
    for k in range(1, 4):
      setup.after_step()
      assert model.progress.item() == pytest.approx(k / 4)
    assert not torch.equal(model(images), model(images))
    model.eval()
    torch.testing.assert_close(model(images), model(images), rtol=0, atol=0)


def test_weight_decay_on_weights_and_the_dense_bias_not_batch_norm():
  cfg = registry.get(NAME).resolve(tiny=True)
  setup = nasnet.build(cfg, CPU)
  net = setup.modules['nasnet'].net
  decay, no_decay = setup.updates[0].optimizer.param_groups
  assert decay['weight_decay'] == cfg['weight_decay'] and no_decay['weight_decay'] == 0
  decayed = {id(p) for p in decay['params']}
  assert id(net.last_linear.bias) in decayed and id(net.conv0.conv.weight) in decayed
  assert id(net.conv0.bn.weight) not in decayed and id(net.cell_0.conv_1x1.bn.bias) not in decayed


def test_one_iteration_then_the_loss_falls_on_a_fixed_batch():
  torch.manual_seed(0)
  cfg = registry.get(NAME).resolve(tiny=True)
  setup = peer_registry.get(NAME).build(cfg, CPU)
  batch = nasnet.make_batch(cfg, 4, torch.Generator().manual_seed(1), CPU)
  losses = [peer_lib.run_updates(setup, batch, step).item() for step in range(20)]
  assert np.isfinite(losses).all()
  # Dropout and drop-path make single steps noisy: compare the means of the first and last five.
  assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses
