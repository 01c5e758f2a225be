"""The PyTorch peer of deeplabv3 trains what the JAX workload trains: timm's xception65 at the JAX
parameter count, the same batch, network, loss and schedule, and it learns on a fixed batch."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import timm
import torch

from models import registry
from models import workload as wl
from models.deeplab import deeplab as jax_deeplab
from models.pytorch import deeplab
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry
from tests import shapes

NAME = 'deeplabv3'
CPU = torch.device('cpu')


pytestmark = pytest.mark.usefixtures('torch_one_thread')


def _peer_parts(model):
  parts = collections.Counter()
  for name, p in model.named_parameters():
    head, *rest = name.split('.')
    if head == 'aspp':  # ASPP's atrous branches are aspp1..3 in the JAX model
      head = f'aspp{int(rest[0]) + 1}'
    parts[head] += p.numel()
  parts['decoder_conv0'] = sum(p.numel() for p in model.decoder[0].parameters())
  parts['decoder_conv1'] = parts.pop('decoder') - parts['decoder_conv0']
  return dict(parts)


def test_full_size_is_timms_xception65_with_the_jax_parameter_count():
  cfg = registry.get(NAME).resolve()
  setup = peer_registry.get(NAME).build(cfg, torch.device('meta'))
  model = setup.modules['deeplabv3']
  with torch.device('meta'):
    reference = timm.create_model('xception65', num_classes=0, global_pool='', output_stride=16)
  torch_shapes = lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()}
  assert torch_shapes(model.xception_65) == torch_shapes(reference)
  jax_params = shapes.state(NAME, cfg).params
  assert _peer_parts(model) == {k: wl.count_params(v) for k, v in jax_params.items()}
  assert setup.param_count() == 41_055_413
  # Output stride 16: exit_flow block 1 loses its stride, block 2 is dilated by 2.
  exit1, exit2 = model.xception_65.blocks[-2:]
  assert exit1.stack.conv3.conv_dw.stride == (1, 1) and exit1.shortcut.conv.stride == (1, 1)
  assert exit2.stack.conv1.conv_dw.dilation == (2, 2)
  momenta = {m.momentum for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)}
  np.testing.assert_allclose(sorted(momenta), [1 - 0.9997])


def test_tiny_parameter_count_equals_jax():
  cfg = registry.get(NAME).resolve(tiny=True)
  setup = peer_registry.get(NAME).build(cfg, torch.device('meta'))
  assert setup.param_count() == wl.count_params(shapes.state(NAME, cfg).params)


def test_batch_has_the_jax_shapes_dtypes_and_values():
  cfg = registry.get(NAME).resolve(tiny=True)
  jax_batch = jax.eval_shape(lambda k: jax_deeplab.make_batch(cfg, k, 3), jax.random.key(0))
  batch = deeplab.make_batch(cfg, 3, torch.Generator().manual_seed(0), CPU)
  assert set(batch) == set(jax_batch)
  n, h, w, c = jax_batch['images'].shape
  assert tuple(batch['images'].shape) == (n, c, h, w)  # NCHW against NHWC
  assert tuple(batch['labels'].shape) == jax_batch['labels'].shape
  for key, value in batch.items():
    assert str(value.dtype).removeprefix('torch.') == str(jax_batch[key].dtype), key
  labels = batch['labels']
  ignored = labels == 255
  assert 0 < float(ignored.float().mean()) < 0.5
  assert int(labels[~ignored].max()) < cfg['classes'] and int(labels.min()) >= 0
  # Every valid pixel's colour is its class's palette colour plus noise: pixels of one class
  # in one image share a mean far from the overall spread of the noise.
  images = batch['images']
  assert float(images.min()) >= -1.0 and float(images.max()) <= 1.0
  for cls in labels[0][~ignored[0]].unique()[:3]:
    pixels = images[0][:, labels[0] == cls]
    assert float(pixels.std(dim=1).max()) < 0.35


def test_loss_equals_the_jax_loss():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7, 7)).astype(np.float32)
  labels = rng.integers(0, 5, size=(2, 7, 7)).astype(np.int32)
  labels[rng.random((2, 7, 7)) < 0.3] = 255
  got = deeplab.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels))
  want, _ = jax_deeplab.loss(
    None, jnp.asarray(logits.transpose(0, 2, 3, 1)), {'labels': jnp.asarray(labels)}
  )
  np.testing.assert_allclose(got.item(), float(want), rtol=1e-6)


def _jax_variables(model):
  """The peer's weights and batch-norm statistics under the JAX module's names."""
  t = lambda x: jnp.asarray(x.detach().numpy())
  kernel = lambda conv: t(conv.weight.permute(2, 3, 1, 0))  # OIHW -> HWIO
  bn = lambda b: (
    {'scale': t(b.weight), 'bias': t(b.bias)},
    {'mean': t(b.running_mean), 'var': t(b.running_var)},
  )

  def conv_bn(conv, norm, conv_name='conv'):
    p, s = bn(norm)
    return {conv_name: {'kernel': kernel(conv)}, 'bn': p}, {'bn': s}

  def separable(dw, dw_bn, pw, pw_bn):
    (dp, ds), (pp, ps) = conv_bn(dw, dw_bn, 'depthwise'), conv_bn(pw, pw_bn)
    return {'depthwise': dp, 'pointwise': pp}, {'depthwise': ds, 'pointwise': ps}

  def pair(tree):
    return {k: v[0] for k, v in tree.items()}, {k: v[1] for k, v in tree.items()}

  net = model.xception_65
  backbone = {
    'entry_flow_conv1_1': conv_bn(net.stem[0].conv, net.stem[0].bn),
    'entry_flow_conv1_2': conv_bn(net.stem[1].conv, net.stem[1].bn),
  }
  names = [name for name, *_ in deeplab.jax_xception.xception_units(model.cfg)]
  for name, block in zip(names, net.blocks, strict=True):
    unit = {}
    for k in range(3):
      s = getattr(block.stack, f'conv{k + 1}')
      unit[f'separable_conv{k + 1}'] = separable(s.conv_dw, s.bn_dw, s.conv_pw, s.bn_pw)
    if block.shortcut is not None:
      unit['shortcut'] = conv_bn(block.shortcut.conv, block.shortcut.bn)
    backbone[name] = pair(unit)
  head_sep = lambda s: separable(s[0], s[1], s[3], s[4])
  tree = {
    'xception_65': pair(backbone),
    'image_pooling': conv_bn(model.image_pooling[0], model.image_pooling[1]),
    'aspp0': conv_bn(model.aspp0[0], model.aspp0[1]),
    **{f'aspp{i + 1}': head_sep(s) for i, s in enumerate(model.aspp)},
    'concat_projection': conv_bn(model.concat_projection[0], model.concat_projection[1]),
    'feature_projection0': conv_bn(model.feature_projection0[0], model.feature_projection0[1]),
    'decoder_conv0': head_sep(model.decoder[0]),
    'decoder_conv1': head_sep(model.decoder[1]),
  }
  params, stats = pair(tree)
  params['logits'] = {'kernel': kernel(model.logits), 'bias': t(model.logits.bias)}
  return params, stats


def test_network_equals_the_jax_network_on_the_same_weights():
  torch.manual_seed(0)
  cfg = registry.get(NAME).resolve(tiny=True)
  model = deeplab.DeepLabV3Plus(cfg)
  with torch.no_grad():  # nonzero biases and statistics: every weight matters
    for m in model.modules():
      if isinstance(m, torch.nn.BatchNorm2d):
        m.weight.uniform_(0.5, 1.5)
        m.bias.normal_(0, 0.1)
        m.running_mean.normal_(0, 0.1)
        m.running_var.uniform_(0.5, 1.5)
    model.logits.bias.normal_()
  model.eval()
  batch = deeplab.make_batch(cfg, 2, torch.Generator().manual_seed(0), CPU)
  with torch.no_grad():
    got = model(batch['images'])
  params, stats = _jax_variables(model)
  state = shapes.state(NAME, cfg)
  assert jax.tree.structure(params) == jax.tree.structure(state.params)
  assert jax.tree.structure(stats) == jax.tree.structure(state.model_state['batch_stats'])
  images = jnp.asarray(batch['images'].permute(0, 2, 3, 1).numpy())
  want = jax_deeplab.DeepLabV3Plus(cfg).apply(
    {'params': params, 'batch_stats': stats}, {'images': images}, train=False
  )
  np.testing.assert_allclose(
    got.permute(0, 2, 3, 1).numpy(), np.asarray(want), rtol=1e-4, atol=1e-4
  )


def test_learning_rate_and_decay_follow_the_jax_optimizer():
  cfg = dict(registry.get(NAME).resolve(tiny=True), total_steps=5)
  setup = deeplab.build(cfg, CPU)
  optimizer = setup.updates[0].optimizer
  decayed = {id(p) for g in optimizer.param_groups if g['weight_decay'] for p in g['params']}
  model = setup.modules['deeplabv3']
  convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
  assert decayed == {id(m.weight) for m in convs if m.groups == 1}
  jax_decayed = jax.tree.leaves(jax_deeplab.decays(shapes.state(NAME, cfg).params))
  assert len(decayed) == sum(jax_decayed)
  # The schedule of jax_deeplab.optimizer.
  want = optax.polynomial_schedule(cfg['lr'], 0.0, cfg['lr_power'], cfg['total_steps'])
  for step in range(7):
    for group in optimizer.param_groups:
      np.testing.assert_allclose(group['lr'], float(want(step)), rtol=1e-6, atol=1e-9)
    optimizer.step()  # no gradients: moves nothing, keeps the scheduler's order
    setup.after_step()


def test_one_iteration_then_the_loss_falls_on_a_fixed_batch():
  torch.manual_seed(0)
  cfg = registry.get(NAME).resolve(tiny=True)
  setup = peer_registry.get(NAME).build(cfg, CPU)
  assert set(setup.modules) == {'deeplabv3'}
  batch = deeplab.make_batch(cfg, 4, torch.Generator().manual_seed(1), CPU)
  # 30 steps, as the JAX workload's test: momentum takes a while to build up.
  losses = [peer_lib.run_updates(setup, batch, step).item() for step in range(30)]
  assert np.isfinite(losses).all()
  assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses
