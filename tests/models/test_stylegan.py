"""StyleGAN: both networks step, each learns with the other frozen, R1, Gs, sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import precision
from models import workload as wl
from models.stylegan import layers as sl
from models.stylegan import stylegan
from tests import tiny as shared

W = stylegan.STYLEGAN
CFG = W.resolve(tiny=True)


@pytest.fixture(scope='module')
def tiny():
  """The tiny trainer, a state, a fixed batch of 2 and one jitted step from that state."""
  t = shared.tiny('stylegan')
  state, batch = shared.start('stylegan')
  new_state, metrics = t.step(state, batch, jax.random.key(2))
  return t.trainer, state, batch, new_state, metrics


def _max_abs_diff(a, b):
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.slow
def test_one_step_updates_both_networks_with_finite_losses(tiny):
  trainer, state, _, new_state, metrics = tiny
  assert set(metrics) >= {'loss', 'g_loss', 'd_loss', 'r1'}
  assert all(np.isfinite(float(v)) for v in metrics.values()), metrics
  assert float(metrics['r1']) > 0
  for name in ('generator', 'discriminator'):
    assert _max_abs_diff(state.params[name], new_state.params[name]) > 0, name
  assert int(new_state.step) == 1
  assert set(trainer.param_groups(new_state)) == {'generator', 'discriminator'}


@pytest.mark.slow
def test_ema_averages_the_generator_before_its_update():
  """As the reference's Gs_update_op, run with D_train_op before G_train_op: each step's
  average takes G as it was before that step's G update. A half-life of one step (beta 0.5)
  makes the order show: the default's beta is 0.99986."""
  assert 0.99 < stylegan.ema_beta(CFG, 2) < 1.0
  cfg = W.resolve(tiny=True, overrides={'ema_kimg': 0.002})
  assert stylegan.ema_beta(cfg, 2) == 0.5
  trainer = W.trainer(cfg, precision.get('fp32'))
  state = jax.jit(trainer.init)(jax.random.key(0))
  batch = jax.jit(trainer.make_batch, static_argnums=1)(jax.random.key(1), 2)
  step = jax.jit(trainer.step)
  first = step(state, batch, jax.random.key(2))[0]
  second = step(first, batch, jax.random.key(2))[0]
  g0, g1 = state.params['generator'], first.params['generator']
  assert _max_abs_diff(g1, g0) > 1e-4  # Adam's first step moves each weight by about lr
  # Relative: the mapping's weights are stored at scale 1/lrmul = 100.
  close = lambda a, b: jax.tree.map(
    lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7), a, b
  )
  close(first.ema, g0)  # Gs started equal to G and averaged G before its first update
  close(second.ema, jax.tree.map(lambda avg, g: 0.5 * avg + 0.5 * g, first.ema, g1))


@pytest.mark.slow
def test_discriminator_learns_with_the_generator_frozen(tiny):
  _, state, batch, _, _ = tiny
  nets, tx = stylegan.Nets(CFG), stylegan.adam(CFG)
  rng = jax.random.key(3)  # the same fakes every step
  d_step = jax.jit(lambda s: stylegan.d_step(nets, tx, s, batch['images'], rng)[:2])
  losses = []
  for _ in range(15):
    state, loss = d_step(state)
    losses.append(float(loss))
  assert np.all(np.isfinite(losses)), losses
  assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses


@pytest.mark.slow
def test_generator_learns_with_the_discriminator_frozen(tiny):
  _, state, _, _, _ = tiny
  nets, tx = stylegan.Nets(CFG), stylegan.adam(CFG)
  rng = jax.random.key(4)  # the same latents and noise every step
  g_step = jax.jit(lambda s: stylegan.g_step(nets, tx, s, 2, rng)[:2])
  losses = []
  for _ in range(15):
    state, loss = g_step(state)
    losses.append(float(loss))
  assert np.all(np.isfinite(losses)), losses
  assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses


def test_r1_is_zero_for_a_discriminator_constant_in_its_input(tiny):
  _, state, batch, _, _ = tiny
  nets = stylegan.Nets(CFG)
  d_params = state.params['discriminator']
  r1 = jax.jit(lambda d: nets.r1(d, batch['images'])[0])
  assert float(jnp.min(r1(d_params))) > 0
  # FromRGB's kernel at zero: D sees only its biases, whatever the image.
  blind = jax.tree_util.tree_map_with_path(
    lambda path, x: jnp.zeros_like(x) if 'from_rgb' in str(path[0]) else x, d_params
  )
  np.testing.assert_array_equal(r1(blind), 0.0)


@pytest.mark.parametrize('resample', ['up', 'down'])
def test_fused_resampling_convolution_matches_the_separate_ops(resample):
  # Host-side random numbers and one jit per variant: on CPU every eagerly run
  # primitive (threefry included) is a compile of its own. Odd-sized H and W sides
  # (6 and 10) so that a phase or a block taken from the wrong row or column shows.
  draw = np.random.default_rng(5).standard_normal
  x = jnp.asarray(draw((2, 6, 10, 4)), jnp.float32)
  convs = [sl.EqConv(6, resample=resample, fused=fused) for fused in (False, True)]
  params = jax.tree.map(
    lambda p: jnp.asarray(draw(p.shape), jnp.float32),  # non-zero biases
    jax.eval_shape(convs[0].init, jax.random.key(6), x),
  )
  separate, fused = (jax.jit(conv.apply)(params, x) for conv in convs)
  assert separate.shape == ((2, 12, 20, 6) if resample == 'up' else (2, 3, 5, 6))
  np.testing.assert_allclose(fused, separate, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('resample', ['up', 'down'])
def test_fused_resampling_has_the_separate_ops_gradients_to_second_order(resample):
  """R1 differentiates the discriminator's input gradient with respect to its weights: the
  phased form must give the first and second derivatives of upsampling (or pooling) and a
  plain convolution."""
  draw = np.random.default_rng(7).standard_normal
  x = jnp.asarray(draw((2, 8, 8, 3)), jnp.float32)
  convs = [sl.EqConv(5, resample=resample, fused=fused) for fused in (False, True)]
  params = jax.tree.map(
    lambda p: jnp.asarray(draw(p.shape), jnp.float32),
    jax.eval_shape(convs[0].init, jax.random.key(8), x),
  )

  def r1_like(conv):
    def penalty(params):
      grad_x = jax.grad(lambda x: jnp.sum(jnp.sin(conv.apply(params, x))))(x)
      return jnp.sum(jnp.square(grad_x))

    return jax.jit(jax.value_and_grad(penalty))(params)

  (v0, g0), (v1, g1) = (r1_like(conv) for conv in convs)
  np.testing.assert_allclose(v1, v0, rtol=1e-5)
  for name in g0['params']:
    np.testing.assert_allclose(g1['params'][name], g0['params'][name], rtol=1e-4, atol=1e-5)


def test_fused_resampling_takes_a_3x3_kernel():
  x = jnp.zeros((1, 4, 4, 2))
  with pytest.raises(ValueError, match='takes a 3x3 kernel, not 5x5'):
    sl.EqConv(3, kernel=5, resample='up', fused=True).init(jax.random.key(0), x)


def _reference_nf(stage, fmap_base=8192, fmap_max=512):
  """networks_stylegan.py's nf(stage) with fmap_decay 1."""
  return min(fmap_base // 2**stage, fmap_max)


def _reference_g_params(latent=512, dlatent=512, res_log2=10, mapping_layers=8):
  """G_style (G_mapping + G_synthesis with structure='fixed': one ToRGB, at 1024) from the layer
  shapes of NVlabs/stylegan's networks_stylegan.py. Convolutions carry no bias of their own; each
  layer's epilogue adds a per-channel noise strength, a bias, and the style: a dense dlatent -> 2C
  with a bias."""
  mapping = (latent * dlatent + dlatent) + (mapping_layers - 1) * (dlatent * dlatent + dlatent)
  epilogue = lambda c: c + c + (dlatent * 2 * c + 2 * c)
  c = _reference_nf(1)
  synthesis = c * 4 * 4 + epilogue(c) + 3 * 3 * c * c + epilogue(c)  # the const, then a conv
  for res in range(3, res_log2 + 1):  # conv0_up and conv1, 3x3 each
    cin, c = _reference_nf(res - 2), _reference_nf(res - 1)
    synthesis += 3 * 3 * cin * c + epilogue(c) + 3 * 3 * c * c + epilogue(c)
  return mapping + synthesis + (c * 3 + 3)  # ToRGB: 1x1 with a bias


def _reference_d_params(res_log2=10, group_stddev=True):
  """D_basic (structure='fixed': one FromRGB, at 1024), every layer with a bias."""
  count = 3 * _reference_nf(res_log2 - 1) + _reference_nf(res_log2 - 1)  # FromRGB 1x1
  for res in range(res_log2, 2, -1):  # conv0 and conv1_down, 3x3 each
    c, cout = _reference_nf(res - 1), _reference_nf(res - 2)
    count += (9 * c * c + c) + (9 * c * cout + cout)
  c = _reference_nf(1)  # 4x4: the minibatch-stddev channel, a conv, dense, dense to one logit
  count += 9 * (c + int(group_stddev)) * c + c
  count += (c * 4 * 4 * _reference_nf(0) + _reference_nf(0)) + (_reference_nf(0) + 1)
  return count


def test_full_size_parameter_counts():
  cfg = W.resolve()
  trainer = W.trainer(cfg, precision.get('fp32'))
  counts = wl.param_counts(trainer, jax.eval_shape(trainer.init, jax.random.key(0)))
  assert counts['generator'] == _reference_g_params(), counts  # the paper's Table 1: 26.2M
  assert counts['discriminator'] == _reference_d_params(), counts
