"""The PyTorch peer of pix2pixhd trains what the JAX workload trains: the same parameters per
network and batch, one update that steps the local enhancer and the discriminators while the
global generator's gradients accumulate, each network's own gradient, and each network learns
with the other frozen."""

import jax
import numpy as np
import pytest
import torch

from models import precision, registry
from models import workload as wl
from models.pix2pixhd import data as jax_data
from models.pix2pixhd import nets as jax_nets
from models.pix2pixhd import pix2pixhd as jax_pix2pixhd
from models.pytorch import peer as peer_lib
from models.pytorch import pix2pixhd
from models.pytorch import registry as peer_registry
from tests import tiny as shared

NAME = 'pix2pixhd'
CPU = torch.device('cpu')
CFG = registry.get(NAME).resolve(tiny=True)


pytestmark = pytest.mark.usefixtures('torch_one_thread')


def _counts(cfg):
  setup = peer_registry.get(NAME).build(cfg, torch.device('meta'))
  counts = {k: sum(p.numel() for p in m.parameters()) for k, m in setup.modules.items()}
  return dict(counts, total=setup.param_count())


def _jax_counts(cfg):
  trainer = registry.get(NAME).trainer(cfg, precision.get('fp32'))
  return wl.param_counts(trainer, jax.eval_shape(trainer.init, jax.random.key(0)))


def test_full_size_parameter_counts_per_network_equal_jax():
  cfg = registry.get(NAME).resolve()
  counts = _counts(cfg)
  assert counts == _jax_counts(cfg)
  assert counts == {'generator': 182_871_171, 'discriminator': 8_404_803, 'total': 191_275_974}


def test_tiny_parameter_counts_per_network_equal_jax():
  assert _counts(CFG) == _jax_counts(CFG)


def _batch(n=2, seed=0):
  return pix2pixhd.make_batch(CFG, n, torch.Generator().manual_seed(seed), CPU)


def test_batch_has_the_jax_shapes_dtypes_and_is_a_label_map():
  want = jax_data.make_batch(CFG, jax.random.key(0), 2)
  batch = _batch()
  assert set(batch) == set(want)
  nchw = lambda shape: (shape[0], shape[3], shape[1], shape[2])
  for key, value in batch.items():
    shape = want[key].shape
    assert tuple(value.shape) == (nchw(shape) if len(shape) == 4 else shape), key
    assert str(value.dtype).removeprefix('torch.') == str(want[key].dtype), key
  label, instance = batch['label'].numpy(), batch['instance'].numpy()
  assert label.min() >= 0 and label.max() < CFG['label_nc']
  assert len(np.unique(label[0])) >= 3  # regions, not noise: a few classes in large areas
  assert np.all(instance // 1000 == np.where(instance >= 1000, label, 0))
  image, feature = batch['image'].numpy(), batch['feature'].numpy().transpose(0, 2, 3, 1)
  assert image.min() >= -1.0 and image.max() <= 1.0
  assert feature.min() >= -1.0 and feature.max() <= 1.0
  # One feature vector per instance, constant over it.
  for i in np.unique(instance[0]):
    assert len(np.unique(feature[0][instance[0] == i], axis=0)) == 1
  assert len(np.unique(feature[0].reshape(-1, 3), axis=0)) >= 3


def test_instance_edges_and_downsample_equal_the_jax_ones():
  ids = torch.tensor([[[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 3, 3]]])
  expected = np.array([[[0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]], bool)
  np.testing.assert_array_equal(pix2pixhd.instance_edges(ids).numpy(), expected)
  x = np.random.default_rng(0).standard_normal((1, 7, 10, 2)).astype(np.float32)
  got = pix2pixhd.downsample(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
  want = np.asarray(jax_nets.downsample(x)).transpose(0, 3, 1, 2)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_one_iteration_steps_the_local_enhancer_and_discriminators_only():
  torch.manual_seed(0)
  setup = peer_registry.get(NAME).build(CFG, CPU)
  generator, discriminator = setup.modules['generator'], setup.modules['discriminator']
  snapshot = lambda params: [p.detach().clone() for p in params]
  trunk, local = (
    snapshot(generator.global_trunk.parameters()),
    snapshot(generator.local_stem.parameters()),
  )
  d_before = snapshot(discriminator.parameters())
  batch = _batch()
  losses = [peer_lib.run_updates(setup, batch, step).item() for step in range(2)]
  assert np.isfinite(losses).all()
  assert all(not torch.equal(a, b) for a, b in zip(d_before, discriminator.parameters()))
  assert all(not torch.equal(a, b) for a, b in zip(local, generator.local_stem.parameters()))
  # The global generator stays (--niter_fix_global); its gradients accumulate, as PyTorch's.
  assert all(torch.equal(a, b) for a, b in zip(trunk, generator.global_trunk.parameters()))
  grads = [p.grad.clone() for p in generator.global_trunk.parameters()]
  assert all(g.abs().sum() > 0 for g in grads)
  peer_lib.run_updates(setup, batch, 2)
  assert all(not torch.equal(a, p.grad) for a, p in zip(grads, generator.global_trunk.parameters()))
  # Without niter_fix_global, Adam holds every parameter.
  every = pix2pixhd.build(dict(CFG, niter_fix_global=0), CPU)
  held = sum(p.numel() for g in every.updates[0].optimizer.param_groups for p in g['params'])
  assert held == every.param_count()


def test_combined_gradient_is_each_networks_own():
  torch.manual_seed(0)
  setup, vgg = pix2pixhd.build_with_vgg(CFG, CPU)
  generator, discriminator = setup.modules['generator'], setup.modules['discriminator']
  batch = _batch()
  params = list(generator.parameters()) + list(discriminator.parameters())
  combined = torch.autograd.grad(setup.updates[0].loss(batch, 0), params, allow_unused=True)
  parts = pix2pixhd.losses(CFG, generator, discriminator, vgg, batch)
  own_g = torch.autograd.grad(parts['g_loss'], list(generator.parameters()), retain_graph=True)
  own_d = torch.autograd.grad(parts['d_loss'], list(discriminator.parameters()))
  for got, want in zip(combined, list(own_g) + list(own_d)):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-7)


def _train_one(net, metric, steps=12):
  """Adam on `net` alone, the other network frozen; the metric at each step."""
  torch.manual_seed(0)
  setup, vgg = pix2pixhd.build_with_vgg(CFG, CPU)
  generator, discriminator = setup.modules['generator'], setup.modules['discriminator']
  optimizer = torch.optim.Adam(setup.modules[net].parameters(), lr=1e-3, betas=(0.5, 0.999))
  batch, values = _batch(), []
  for _ in range(steps):
    optimizer.zero_grad()
    loss = pix2pixhd.losses(CFG, generator, discriminator, vgg, batch)[metric]
    loss.backward()
    optimizer.step()
    values.append(loss.item())
  assert np.all(np.isfinite(values)), values
  return values


def test_discriminator_loss_falls_with_generator_frozen():
  values = _train_one('discriminator', 'd_loss')
  assert np.mean(values[-3:]) < 0.5 * np.mean(values[:3]), values


def test_generator_loss_falls_with_discriminator_frozen():
  values = _train_one('generator', 'g_loss')
  assert np.mean(values[-3:]) < 0.8 * np.mean(values[:3]), values


def test_vgg_loss_zero_for_identical_images():
  torch.manual_seed(0)
  vgg = pix2pixhd.VGG19Features(CFG['vgg_base'])
  assert not any(p.requires_grad for p in vgg.parameters())
  image = _batch()['image']
  assert pix2pixhd.perceptual_loss(vgg, image, image).item() == 0.0
  assert pix2pixhd.perceptual_loss(vgg, image, -image).item() > 0.0


def _torch_state_from_jax(params):
  """The JAX workload's generator and discriminator parameters under the peer's names."""
  state = {}
  for path, value in jax.tree_util.tree_flatten_with_path(params)[0]:
    net, *keys, leaf = [k.key for k in path]
    value, names = np.asarray(value), [net]
    transpose = any(k.startswith('up_') or k == 'local_up' for k in keys)
    for k in keys:
      head, _, index = k.rpartition('_')
      if k == 'global':
        names.append('global_trunk')
      elif head in ('down', 'up', 'local_block', 'block'):
        names += [{'block': 'blocks', 'local_block': 'local_blocks'}.get(head, head), index]
      elif head == 'Conv' and net == 'generator':
        names.append(f'conv{int(index) + 1}')
      elif head == 'Conv':
        names += ['layers', index]
      elif head == 'scale':
        names += ['scales', index]
      else:
        names.append(k)
    if leaf == 'kernel':
      # A convolution's HWIO kernel is OIHW here; a transposed one's is flipped, IOHW.
      value = value[::-1, ::-1].transpose(2, 3, 0, 1) if transpose else value.transpose(3, 2, 0, 1)
      leaf = 'weight'
    state['.'.join(names + [leaf])] = torch.from_numpy(value.copy())
  return state


def test_networks_compute_the_jax_networks_with_their_weights():
  params = shared.start(NAME)[0].params
  draw = np.random.default_rng(0).standard_normal
  params = jax.tree.map(lambda p: np.asarray(p) + 0.05 * draw(p.shape).astype(np.float32), params)
  setup = pix2pixhd.build(CFG, CPU)
  modules = torch.nn.ModuleDict(setup.modules)
  modules.load_state_dict(_torch_state_from_jax(params), strict=True)
  batch = _batch()
  generator_input, condition = pix2pixhd.encode_input(CFG, batch)
  nhwc = lambda t: np.asarray(t.detach().numpy()).transpose(0, 2, 3, 1)
  nets = jax_pix2pixhd.build(CFG)
  with torch.no_grad():
    fake = modules['generator'](generator_input)
  want = nets.generator.apply({'params': params['generator']}, nhwc(generator_input))
  np.testing.assert_allclose(nhwc(fake), np.asarray(want), rtol=1e-5, atol=1e-5)
  pair = torch.cat([condition, batch['image']], dim=1)
  with torch.no_grad():
    got = modules['discriminator'](pair)
  want = nets.discriminator.apply({'params': params['discriminator']}, nhwc(pair))
  for got_scale, want_scale in zip(got, want, strict=True):
    for a, b in zip(got_scale, want_scale, strict=True):
      np.testing.assert_allclose(nhwc(a), np.asarray(b), rtol=1e-5, atol=1e-5)
