"""The PyTorch peer of stylegan trains what the JAX workload trains: the same parameters per
network, batch and layers (the fused resampling, blur and minibatch stddev compute the JAX
functions), R1 on the reals, Gs, and each network learns with the other frozen."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from models import precision, registry
from models import workload as wl
from models.pytorch import gradfix, stylegan
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry
from models.stylegan import layers as jax_layers
from models.stylegan import train as jax_train
from models.stylegan.nets import log2_res
from tests import tiny as shared

NAME = 'stylegan'
CPU = torch.device('cpu')
CFG = registry.get(NAME).resolve(tiny=True)


pytestmark = pytest.mark.usefixtures('torch_one_thread')


def _jax_counts(cfg):
  trainer = registry.get(NAME).trainer(cfg, precision.get('fp32'))
  return wl.param_counts(trainer, jax.eval_shape(trainer.init, jax.random.key(0)))


def _counts(cfg):
  setup = peer_registry.get(NAME).build(cfg, torch.device('meta'))
  counts = {k: sum(p.numel() for p in m.parameters()) for k, m in setup.modules.items()}
  return dict(counts, total=setup.param_count())


def test_full_size_parameter_counts_per_network_equal_jax():
  counts = _counts(registry.get(NAME).resolve())
  assert counts == _jax_counts(registry.get(NAME).resolve())
  assert counts == {'generator': 26_212_019, 'discriminator': 23_077_137, 'total': 49_289_156}


def test_tiny_parameter_counts_per_network_equal_jax():
  assert _counts(CFG) == _jax_counts(CFG)


def test_batch_has_the_jax_shapes_dtypes_and_values():
  want = jax_train.make_batch(CFG, jax.random.key(0), 5)['images']
  images = stylegan.make_batch(CFG, 5, torch.Generator().manual_seed(0), CPU)['images']
  n, h, w, c = want.shape
  assert tuple(images.shape) == (n, c, h, w)  # NCHW
  assert images.dtype == torch.float32 and str(want.dtype) == 'float32'
  assert -1.0 <= float(images.min()) and float(images.max()) <= 1.0
  # The JAX construction on the same numbers: bilinear resize, grain, clip.
  rng = np.random.default_rng(0)
  coarse = rng.uniform(-1, 1, (2, 4, 4, 3)).astype(np.float32)
  grain = rng.standard_normal((2, 16, 16, 3)).astype(np.float32)
  jax_images = jnp.clip(jax.image.resize(coarse, (2, 16, 16, 3), 'bilinear') + 0.05 * grain, -1, 1)
  nchw = lambda a: torch.from_numpy(np.ascontiguousarray(a.transpose(0, 3, 1, 2)))
  got = stylegan.smooth_images(nchw(coarse), nchw(grain))
  np.testing.assert_allclose(got.numpy(), np.asarray(jax_images).transpose(0, 3, 1, 2), atol=1e-6)


def _nhwc(t):
  return jnp.asarray(t.detach().numpy().transpose(0, 2, 3, 1))


@pytest.mark.parametrize('resample', ['up', 'down'])
def test_fused_resampling_computes_the_jax_convolution(resample):
  # Odd-sized sides (6 and 10) so that a kernel flipped or shifted by a pixel shows.
  torch.manual_seed(0)
  x = torch.randn(2, 4, 6, 10)
  fused = stylegan.EqConv(4, 6, resample=resample, fused=True)
  separate = stylegan.EqConv(4, 6, resample=resample, fused=False)
  with torch.no_grad():
    fused.bias.normal_()
  separate.load_state_dict(fused.state_dict())
  got = fused(x)
  assert tuple(got.shape) == ((2, 6, 12, 20) if resample == 'up' else (2, 6, 3, 5))
  np.testing.assert_allclose(got.detach().numpy(), separate(x).detach().numpy(), atol=1e-5)
  params = {
    'kernel': jnp.asarray(fused.weight.detach().numpy().transpose(2, 3, 1, 0)),
    'bias': jnp.asarray(fused.bias.detach().numpy()),
  }
  want = jax_layers.EqConv(6, resample=resample, fused=True).apply({'params': params}, _nhwc(x))
  np.testing.assert_allclose(_nhwc(got), want, rtol=1e-5, atol=1e-5)


def test_fused_resampling_takes_a_3x3_kernel():
  with pytest.raises(ValueError, match='takes a 3x3 kernel, not 5x5'):
    stylegan.EqConv(2, 3, kernel=5, resample='up', fused=True)


def test_blur_and_minibatch_stddev_compute_the_jax_functions():
  torch.manual_seed(0)
  x = torch.randn(6, 4, 5, 7)  # groups of 3: image i in group i % 2
  np.testing.assert_allclose(
    _nhwc(stylegan.Blur(4)(x)), jax_layers.blur(_nhwc(x), 'shifts'), rtol=1e-5, atol=1e-6
  )
  got = stylegan.minibatch_stddev(x, 4, 2)
  assert tuple(got.shape) == (6, 6, 5, 7)
  np.testing.assert_allclose(
    _nhwc(got), jax_layers.minibatch_stddev(_nhwc(x), 4, 2), rtol=1e-5, atol=1e-6
  )


def _setup_and_batch(seed=0):
  torch.manual_seed(seed)
  setup = peer_registry.get(NAME).build(CFG, CPU)
  batch = stylegan.make_batch(CFG, 2, torch.Generator().manual_seed(1), CPU)
  return setup, batch


def test_one_iteration_updates_both_networks_and_w_avg():
  setup, batch = _setup_and_batch()
  assert [u.optimizer.param_groups[0]['betas'] for u in setup.updates] == [(0.0, 0.99)] * 2
  before = {k: [p.detach().clone() for p in m.parameters()] for k, m in setup.modules.items()}
  loss = peer_lib.run_updates(setup, batch, 0)
  assert np.isfinite(loss.item())
  for name, module in setup.modules.items():
    moved = [not torch.equal(a, b) for a, b in zip(before[name], module.parameters())]
    assert any(moved), name
  assert setup.modules['generator'].w_avg.abs().sum() > 0  # tracked from both G runs


def test_gs_averages_the_generator_before_its_update():
  """As the JAX workload (the reference's Gs_update_op runs with D_train_op, before
  G_train_op). A half-life of one step (beta 0.5) makes the order show."""
  assert 0.99 < jax_train.ema_beta(CFG, 2) < 1.0
  cfg = dict(CFG, ema_kimg=0.002)
  assert jax_train.ema_beta(cfg, 2) == 0.5
  torch.manual_seed(0)
  setup, gs = stylegan.build_with_average(cfg, CPU)
  batch = stylegan.make_batch(cfg, 2, torch.Generator().manual_seed(1), CPU)
  assert not any(p.requires_grad for p in gs.average.parameters())
  snapshot = lambda m: [p.detach().clone() for p in m.parameters()]
  g0 = snapshot(setup.modules['generator'])
  peer_lib.run_updates(setup, batch, 0)
  g1, gs1 = snapshot(setup.modules['generator']), snapshot(gs.average)
  assert max((a - b).abs().max().item() for a, b in zip(g1, g0)) > 1e-4  # G moved
  # Relative: the mapping's weights are stored at scale 1/lrmul = 100.
  close = lambda got, want: [
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    for a, b in zip(got, want)
  ]
  close(gs1, g0)  # Gs started equal to G and averaged G before its first update
  peer_lib.run_updates(setup, batch, 1)
  close(snapshot(gs.average), [0.5 * a + 0.5 * g for a, g in zip(gs1, g1)])


def _learns(update_index, seed):
  setup, batch = _setup_and_batch()
  one = dataclasses.replace(setup, updates=[setup.updates[update_index]], after_step=None)
  losses = []
  for step in range(15):
    torch.manual_seed(seed)  # the same latents, noise and mixing every step
    losses.append(peer_lib.run_updates(one, batch, step).item())
  assert np.all(np.isfinite(losses)), losses
  assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses


def test_discriminator_learns_with_the_generator_frozen():
  _learns(0, seed=3)


def test_generator_learns_with_the_discriminator_frozen():
  _learns(1, seed=4)


def test_r1_is_the_squared_input_gradient_on_the_reals():
  setup, batch = _setup_and_batch()
  generator, discriminator = setup.modules['generator'], setup.modules['discriminator']

  def penalty(gamma):
    torch.manual_seed(5)
    return stylegan.d_loss(generator, discriminator, batch['images'], gamma).item()

  reals = batch['images'].clone().requires_grad_(True)
  (grads,) = torch.autograd.grad(discriminator(reals).sum(), reals)
  r1 = grads.square().sum(dim=(1, 2, 3)).mean().item()
  assert r1 > 0
  np.testing.assert_allclose(penalty(10.0) - penalty(0.0), 5.0 * r1, rtol=1e-4)
  # FromRGB's kernel at zero: D sees only its biases, whatever the image, and R1 is zero.
  with torch.no_grad():
    discriminator.from_rgb.weight.zero_()
  assert penalty(10.0) == penalty(0.0)


def test_generator_update_leaves_the_discriminator_without_gradients():
  setup, batch = _setup_and_batch()
  g_update = setup.updates[1]
  g_update.loss(batch, 0).backward()
  assert all(p.grad is None for p in setup.modules['discriminator'].parameters())
  assert all(p.grad is not None for p in setup.modules['generator'].synthesis.parameters())


@pytest.mark.slow
def test_discriminator_update_runs_under_torch_compile():
  # AOT autograd does not differentiate twice: R1 stays eager inside the compiled loss.
  setup, batch = _setup_and_batch()
  d_update = setup.updates[0]
  eager = d_update.loss
  d_update.loss = torch.compile(eager, backend='aot_eager')
  torch.manual_seed(6)
  compiled = peer_lib.run_updates(dataclasses.replace(setup, updates=[d_update]), batch, 0)
  setup, _ = _setup_and_batch()
  torch.manual_seed(6)
  want = peer_lib.run_updates(dataclasses.replace(setup, updates=[setup.updates[0]]), batch, 0)
  np.testing.assert_allclose(compiled.item(), want.item(), rtol=1e-5)


def _conv(kernel_KxKxIxO):
  return kernel_KxKxIxO.transpose(3, 2, 0, 1)


def _torch_state_from_jax(params, cfg):
  """The JAX workload's generator and discriminator parameters under the peer's names."""
  g, d = params['generator'], params['discriminator']
  state = {'generator.w_avg': np.zeros(cfg['latent_size'], np.float32)}  # a buffer, not trained
  for i in range(cfg['mapping_layers']):
    dense = g['mapping'][f'dense_{i}']
    state[f'generator.mapping.dense.{i}.weight'] = dense['kernel'].T
    state[f'generator.mapping.dense.{i}.bias'] = dense['bias']
  s = g['synthesis']
  state['generator.synthesis.const'] = s['const'].transpose(2, 0, 1)[None]
  state['generator.synthesis.conv_4.weight'] = _conv(s['conv_4']['kernel'])
  state['generator.synthesis.to_rgb.weight'] = _conv(s['to_rgb']['kernel'])
  state['generator.synthesis.to_rgb.bias'] = s['to_rgb']['bias']
  for i, size in enumerate(2**r for r in range(3, log2_res(cfg) + 1)):
    state[f'generator.synthesis.up.{i}.weight'] = _conv(s[f'conv0_up_{size}']['kernel'])
    state[f'generator.synthesis.conv.{i}.weight'] = _conv(s[f'conv1_{size}']['kernel'])
  for i in range(2 * log2_res(cfg) - 2):
    e, prefix = s[f'epilogue_{i}'], f'generator.synthesis.epilogues.{i}'
    state[f'{prefix}.noise_strength'] = e['noise_strength']
    state[f'{prefix}.bias'] = e['bias']
    state[f'{prefix}.style.weight'] = e['style']['dense']['kernel'].T
    state[f'{prefix}.style.bias'] = e['style']['dense']['bias']
  conv = lambda name, jax_name: state.update(
    {
      f'discriminator.{name}.weight': _conv(d[jax_name]['kernel']),
      f'discriminator.{name}.bias': d[jax_name]['bias'],
    }
  )
  conv('from_rgb', 'from_rgb')
  conv('conv_4', 'conv_4')
  for i, size in enumerate(2**r for r in range(log2_res(cfg), 2, -1)):
    conv(f'conv0.{i}', f'conv0_{size}')
    conv(f'down.{i}', f'conv1_down_{size}')
  # JAX flattens H x W x C, the peer C x H x W.
  kernel = d['dense0']['kernel']
  c = kernel.shape[0] // 16
  state['discriminator.dense0.weight'] = (
    kernel.reshape(4, 4, c, -1).transpose(2, 0, 1, 3).reshape(16 * c, -1).T
  )
  state['discriminator.dense0.bias'] = d['dense0']['bias']
  state['discriminator.dense1.weight'] = d['dense1']['kernel'].T
  state['discriminator.dense1.bias'] = d['dense1']['bias']
  return {k: torch.from_numpy(np.array(v)) for k, v in state.items()}


def test_networks_compute_the_jax_networks_with_their_weights():
  params = shared.start(NAME)[0].params
  # Every parameter non-zero (biases and styles too), but the noise strengths: the two draw
  # their noise differently.
  draw = np.random.default_rng(0).standard_normal
  params = jax.tree_util.tree_map_with_path(
    lambda path, p: (
      p if 'noise_strength' in str(path) else p + 0.3 * draw(p.shape).astype(np.float32)
    ),
    params,
  )
  params = jax.tree.map(np.asarray, params)
  setup = stylegan.build(CFG, CPU)
  modules = torch.nn.ModuleDict(setup.modules)
  modules.load_state_dict(_torch_state_from_jax(params, CFG), strict=True)
  nets = jax_train.Nets(CFG)
  images = stylegan.make_batch(CFG, 4, torch.Generator().manual_seed(0), CPU)['images']
  with torch.no_grad():
    got = modules['discriminator'](images)
  want = nets.score(params['discriminator'], _nhwc(images))
  np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=1e-5, atol=1e-5)
  z = np.random.default_rng(1).standard_normal((3, CFG['latent_size'])).astype(np.float32)
  generator = modules['generator'].eval()  # no style mixing
  with torch.no_grad():
    got = generator(torch.from_numpy(z))
  want, _ = nets.generator.apply(
    {'params': params['generator']},
    jnp.asarray(z),
    train=False,
    rngs={'dropout': jax.random.key(2)},
  )
  np.testing.assert_allclose(_nhwc(got), want, rtol=1e-5, atol=1e-5)


def _r1_weight_grad(conv, blur, x, weight):
  """The R1 pattern: the weight gradient of |d conv(blur(x)) / dx|^2 (a second derivative)."""
  x = x.detach().requires_grad_(True)
  (grad_x,) = torch.autograd.grad(conv(blur(x), weight).square().sum(), x, create_graph=True)
  return torch.autograd.grad(grad_x.square().sum(), weight)[0], grad_x


@pytest.mark.parametrize('stride,padding,k', [(1, 1, 3), (2, 1, 4), (1, 0, 1)])
def test_conv_and_blur_second_derivatives_equal_autograds(stride, padding, k):
  """models/pytorch/gradfix.py's derivatives are autograd's, to the second order."""
  x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
  weight = torch.randn(5, 3, k, k, dtype=torch.float64, requires_grad=True)
  kernel = stylegan.Blur(3).kernel.double()
  want = _r1_weight_grad(
    lambda a, w: F.conv2d(a, w, stride=stride, padding=padding),
    lambda a: F.conv2d(a, kernel, padding=1, groups=3),
    x,
    weight,
  )
  got = _r1_weight_grad(
    lambda a, w: gradfix.conv2d(a, w, stride, padding),
    lambda a: gradfix.blur(a, kernel),
    x,
    weight,
  )
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.detach().numpy(), w.detach().numpy(), rtol=1e-9, atol=1e-9)
  conv = lambda a, w: gradfix.conv2d(a, w, stride, padding)
  assert torch.autograd.gradgradcheck(conv, (x.requires_grad_(True), weight))


def test_conv_under_autocast_computes_in_its_dtype_and_returns_float32_gradients():
  x, weight = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 4, 4, requires_grad=True)
  with torch.autocast('cpu', dtype=torch.bfloat16):
    y = gradfix.conv2d(stylegan.Blur(3)(x), weight, 2, 1)
    grad_w, _ = _r1_weight_grad(
      lambda a, w: gradfix.conv2d(a, w, 2, 1), stylegan.Blur(3), x, weight
    )
  assert y.dtype == torch.bfloat16 and grad_w.dtype == torch.float32
