"""Pix2PixHD: parameter counts, the two-network step, each network's loss, VGG and edges."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models import precision
from models import workload as wl
from models.pix2pixhd import data as pix2pixhd_data
from models.pix2pixhd import nets as pix2pixhd_nets
from models.pix2pixhd import pix2pixhd, vgg
from tests import tiny as shared

W = pix2pixhd.PIX2PIXHD
TINY = W.resolve(tiny=True)


def _reference_generator(inputs=39, ngf=32, n_down=4, n_global=9, n_local=3, output_nc=3):
  """(global, local enhancer) parameters of NVIDIA/pix2pixHD's LocalEnhancer, from its layer
  shapes (Conv2d and ConvTranspose2d with bias, instance norm without affine): `inputs` is 35
  labels + the edge map + 3 instance features (--instance_feat --load_features)."""
  conv = lambda k, cin, cout: k * k * cin * cout + cout
  g = 2 * ngf  # the global generator's width; its last convolution is dropped by netG=local
  glob = conv(7, inputs, g)
  glob += sum(conv(3, g * 2**i, g * 2 ** (i + 1)) for i in range(n_down))
  glob += n_global * 2 * conv(3, g * 2**n_down, g * 2**n_down)
  glob += sum(conv(3, g * 2 ** (n_down - i), g * 2 ** (n_down - i - 1)) for i in range(n_down))
  local = conv(7, inputs, ngf) + conv(3, ngf, 2 * ngf)  # model1_1
  local += n_local * 2 * conv(3, 2 * ngf, 2 * ngf) + conv(3, 2 * ngf, ngf)  # model1_2
  local += conv(7, ngf, output_nc)
  return glob, local


def _reference_discriminator(inputs=39, ndf=64, n_layers=3, num_d=3):
  """MultiscaleDiscriminator: `num_d` NLayerDiscriminators of 4x4 convolutions with a bias
  (instance norm without affine) on 35 labels + edges + the image; the discriminators do not
  see the instance features."""
  conv = lambda cin, cout: 16 * cin * cout + cout
  widths = [inputs] + [ndf * 2**i for i in range(n_layers + 1)] + [1]
  return num_d * sum(conv(cin, cout) for cin, cout in zip(widths, widths[1:]))


REFERENCE_G, REFERENCE_D = 182_871_171, _reference_discriminator()


def _trainer(cfg=TINY, policy='fp32'):
  return W.trainer(cfg, precision.get(policy))


# The fixture compiles init, the batch and the combined gradient (about 30 s of CPU):
# the tests that use it are marked slow.
@pytest.fixture(scope='module')
def tiny():
  """Tiny state, a fixed batch of 2, and the jitted gradient of the combined loss."""
  nets = pix2pixhd.build(TINY)
  state, batch = shared.start('pix2pixhd')
  grad_fn = jax.jit(
    jax.value_and_grad(functools.partial(pix2pixhd.losses, nets, TINY), has_aux=True)
  )
  return state, batch, grad_fn


def test_param_counts_at_full_size():
  trainer = _trainer(W.config)
  shapes = jax.eval_shape(trainer.init, jax.random.key(0))
  counts = wl.param_counts(trainer, shapes)
  glob, local = _reference_generator()
  # The total counts the two networks alone: the fixed VGG19 is not among the trained parameters.
  total = REFERENCE_G + REFERENCE_D
  assert counts == {'total': total, 'generator': REFERENCE_G, 'discriminator': REFERENCE_D}
  assert wl.count_params(shapes.vgg_params) > 12_000_000  # VGG19 up to conv5_1
  generator = shapes.params['generator']
  assert generator['global']['stem']['kernel'].shape == (7, 7, 39, 64)
  assert generator['local_stem']['kernel'].shape == (7, 7, 39, 32)
  assert shapes.params['discriminator']['scale_0']['Conv_0']['kernel'].shape[2] == 39
  # --niter_fix_global: the generator's Adam holds the local enhancer alone, and the global
  # generator's gradients have a buffer of their own, as PyTorch's .grad.
  assert wl.count_params(generator['global']) == glob
  assert wl.count_params(shapes.opt_state['generator']) == 2 * local + 1  # mu, nu and a count
  assert wl.count_params(shapes.opt_state['discriminator']) == 2 * REFERENCE_D + 1
  assert wl.count_params(shapes.global_grads) == glob


@pytest.mark.slow
def test_one_step_updates_both_networks(tiny):
  state, batch, grad_fn = tiny
  new, metrics = shared.tiny('pix2pixhd').step(state, batch, jax.random.key(0))
  for name in ('loss', 'g_loss', 'd_loss'):
    assert np.isfinite(float(metrics[name])), metrics
  # The losses reported are those at the parameters the step started from, whose gradients
  # (test_combined_gradient_is_each_networks_own) are each network's own.
  (value, expected), _ = grad_fn(state.params, state.vgg_params, batch)
  for name, want in {'loss': value, **expected}.items():
    np.testing.assert_allclose(metrics[name], want, rtol=1e-5, err_msg=name)
  moved = lambda a, b: jax.tree.map(lambda x, y: bool(jnp.any(x != y)), a, b)
  local = lambda p: {k: v for k, v in p.items() if k != 'global'}
  assert all(jax.tree.leaves(moved(new.params['discriminator'], state.params['discriminator'])))
  generator, old = new.params['generator'], state.params['generator']
  assert all(jax.tree.leaves(moved(local(generator), local(old))))
  # The global generator stays (--niter_fix_global), its gradients computed into their buffer.
  assert not any(jax.tree.leaves(moved(generator['global'], old['global'])))
  assert all(jax.tree.leaves(moved(new.global_grads, state.global_grads)))
  same = jax.tree.map(lambda a, b: bool(jnp.all(a == b)), new.vgg_params, state.vgg_params)
  assert all(jax.tree.leaves(same))
  assert int(new.step) == 1


def _train_one(tiny, net, metric, steps=12):
  """Adam on `net` alone, the other network frozen; the metric at each step."""
  state, batch, grad_fn = tiny
  params = state.params
  tx = optax.adam(1e-3, b1=0.5)
  opt_state = tx.init(params[net])
  values = []
  for _ in range(steps):
    (_, metrics), grads = grad_fn(params, state.vgg_params, batch)
    values.append(float(metrics[metric]))
    updates, opt_state = tx.update(grads[net], opt_state)
    params = {**params, net: optax.apply_updates(params[net], updates)}
  return values


@pytest.mark.slow
def test_discriminator_loss_falls_with_generator_frozen(tiny):
  values = _train_one(tiny, 'discriminator', 'd_loss')
  assert np.all(np.isfinite(values))
  assert np.mean(values[-3:]) < 0.5 * np.mean(values[:3]), values


@pytest.mark.slow
def test_generator_loss_falls_with_discriminator_frozen(tiny):
  values = _train_one(tiny, 'generator', 'g_loss')
  assert np.all(np.isfinite(values))
  assert np.mean(values[-3:]) < 0.8 * np.mean(values[:3]), values


@pytest.mark.slow
def test_combined_gradient_is_each_networks_own(tiny):
  """The one backward pass gives G the gradient of g_loss and D that of d_loss."""
  state, batch, grad_fn = tiny
  nets = pix2pixhd.build(TINY)
  _, grads = grad_fn(state.params, state.vgg_params, batch)
  for net, metric in (('generator', 'g_loss'), ('discriminator', 'd_loss')):

    def own(p, net=net, metric=metric):
      return pix2pixhd.losses(nets, TINY, {**state.params, net: p}, state.vgg_params, batch)[1][
        metric
      ]

    expected = jax.jit(jax.grad(own))(state.params[net])
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7), grads[net], expected
    )


@pytest.mark.slow
def test_vgg_loss_zero_for_identical_images(tiny):
  state, batch, _ = tiny
  module = vgg.VGG19Features(TINY['vgg_base'])
  image = batch['image']
  loss = jax.jit(functools.partial(vgg.perceptual_loss, module))
  assert float(loss(state.vgg_params, image, image)) == 0.0
  assert float(loss(state.vgg_params, image, -image)) > 0.0


def test_batch_is_a_plausible_label_map():
  batch = jax.jit(_trainer().make_batch, static_argnums=1)(jax.random.key(3), 2)
  label, instance = np.asarray(batch['label']), np.asarray(batch['instance'])
  assert label.shape == (2, TINY['height'], TINY['width']) and label.dtype == np.int32
  assert label.min() >= 0 and label.max() < TINY['label_nc']
  assert len(np.unique(label[0])) >= 3  # regions, not noise: a few classes in large areas
  assert np.all(instance // 1000 == np.where(instance >= 1000, label, 0))
  image = np.asarray(batch['image'])
  assert image.min() >= -1.0 and image.max() <= 1.0
  # Precomputed instance features: one vector in [-1, 1] per instance, constant over it.
  feature = np.asarray(batch['feature'])
  assert feature.shape == label.shape + (3,) and feature.min() >= -1.0 and feature.max() <= 1.0
  for i in np.unique(instance[0]):
    assert len(np.unique(feature[0][instance[0] == i], axis=0)) == 1
  assert len(np.unique(feature[0].reshape(-1, 3), axis=0)) >= 3


def test_downsample_divides_by_the_taps_inside():
  x = jax.random.normal(jax.random.key(0), (1, 7, 10, 2))
  expected = nn.avg_pool(
    x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), count_include_pad=False
  )
  np.testing.assert_allclose(pix2pixhd_nets.downsample(x), expected, rtol=1e-6)


def test_instance_edges_mark_both_sides_of_a_boundary():
  ids = jnp.array([[[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 3, 3]]])
  expected = np.array([[[0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]]], bool)
  np.testing.assert_array_equal(pix2pixhd_data.instance_edges(ids), expected)


def test_flops_per_example():
  g = W.flops_per_example(W.config)
  assert 1.0e13 < g < 1.3e13  # about 11.7 TFLOPs per 2048x1024 image
  assert W.flops_per_example(TINY) < g / 1000


def test_phased_upsampling_is_the_transposed_convolution():
  """PhasedUp has nn.ConvTranspose's parameters and computes its function, gradients included;
  odd sides (3x5) so that a phase taken from the wrong row or column shows."""
  draw = np.random.default_rng(3).standard_normal
  x = jnp.asarray(draw((2, 3, 5, 4)), jnp.float32)
  transposed = nn.ConvTranspose(6, (3, 3), strides=(2, 2), padding=((1, 2), (1, 2)))
  phased = pix2pixhd_nets.PhasedUp(6)
  shapes = jax.eval_shape(transposed.init, jax.random.key(0), x)
  assert jax.tree.map(lambda s: s.shape, shapes) == jax.tree.map(
    lambda s: s.shape, jax.eval_shape(phased.init, jax.random.key(0), x)
  )
  params = jax.tree.map(lambda s: jnp.asarray(draw(s.shape), jnp.float32), shapes)

  def loss(module):
    return jax.jit(
      jax.value_and_grad(lambda p, x: jnp.sum(jnp.sin(module.apply(p, x))), argnums=(0, 1))
    )(params, x)

  (v0, (gp0, gx0)), (v1, (gp1, gx1)) = loss(transposed), loss(phased)
  assert transposed.apply(params, x).shape == phased.apply(params, x).shape == (2, 6, 10, 6)
  np.testing.assert_allclose(phased.apply(params, x), transposed.apply(params, x), atol=1e-5)
  np.testing.assert_allclose(v1, v0, rtol=1e-5)
  np.testing.assert_allclose(gx1, gx0, rtol=1e-4, atol=1e-5)
  for name in ('kernel', 'bias'):
    np.testing.assert_allclose(gp1['params'][name], gp0['params'][name], rtol=1e-4, atol=1e-5)
