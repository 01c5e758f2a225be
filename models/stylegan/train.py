"""StyleGAN (Karras et al. 2019) training: logistic D loss with R1, non-saturating G, EMA Gs."""

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from models import workload as wl
from models.stylegan.nets import Discriminator, Generator


def make_batch(cfg, rng, n):
  """Smooth random colour images in [-1, 1]: a 4x4 pattern resized, plus a little grain."""
  coarse_rng, fine_rng = jax.random.split(rng)
  r = cfg['resolution']
  coarse = jax.random.uniform(coarse_rng, (n, 4, 4, 3), jnp.float32, -1.0, 1.0)
  images = jax.image.resize(coarse, (n, r, r, 3), 'bilinear')
  images = images + 0.05 * jax.random.normal(fine_rng, (n, r, r, 3), jnp.float32)
  return {'images': jnp.clip(images, -1.0, 1.0)}


@flax.struct.dataclass
class GANState:
  """Both networks, their optimizers, and the generator's moving averages."""

  step: jax.Array
  params: Any  # {'generator': ..., 'discriminator': ...}
  ema: Any  # the reference's Gs: a moving average of the generator's parameters
  w_avg: jax.Array  # the reference's dlatent_avg: a moving average of W
  opt_state: Any  # {'generator': ..., 'discriminator': ...}
  loss_scale: Any  # {'generator': DynamicScale, 'discriminator': DynamicScale} under fp16


class Nets:
  """The two modules at one config and compute dtype, and the pure losses on them."""

  def __init__(self, cfg, dtype=jnp.float32):
    self.cfg = cfg
    self.generator = Generator(cfg, dtype)
    self.discriminator = Discriminator(cfg, dtype)

  def generate(self, g_params, n, rng):
    # Flax folds the module path into the 'dropout' key, so the draws differ from z's.
    z = jax.random.normal(rng, (n, self.cfg['latent_size']), jnp.float32)
    return self.generator.apply({'params': g_params}, z, train=True, rngs={'dropout': rng})

  def score(self, d_params, images):
    return self.discriminator.apply({'params': d_params}, images).astype(jnp.float32)

  def r1(self, d_params, reals, scale=1.0):
    """Per-image squared norm of grad_x D(x) on the reals, and D(reals).

    `scale` multiplies the inner gradient's seed (loss scaling under fp16) and
    is divided out in float32, as the reference's apply/undo_loss_scaling.
    """
    scores, vjp = jax.vjp(lambda x: self.score(d_params, x), reals)
    (grads,) = vjp(jnp.full_like(scores, scale))
    grads = grads.astype(jnp.float32) / scale
    return jnp.sum(jnp.square(grads), axis=(1, 2, 3)), scores

  def d_loss(self, d_params, g_params, reals, rng, scale=1.0):
    """D_logistic_simplegp: softplus(D(fake)) + softplus(-D(real)) + gamma/2 * R1."""
    fakes, w_mean = self.generate(g_params, reals.shape[0], rng)
    fake_scores = self.score(d_params, jax.lax.stop_gradient(fakes))
    r1, real_scores = self.r1(d_params, reals, scale)
    loss = jnp.mean(
      jax.nn.softplus(fake_scores)
      + jax.nn.softplus(-real_scores)
      + r1 * (self.cfg['r1_gamma'] * 0.5)
    )
    return loss, {'r1': jnp.mean(r1), 'w_mean': jax.lax.stop_gradient(w_mean)}

  def g_loss(self, g_params, d_params, n, rng):
    """G_logistic_nonsaturating: softplus(-D(G(z)))."""
    fakes, w_mean = self.generate(g_params, n, rng)
    loss = jnp.mean(jax.nn.softplus(-self.score(d_params, fakes)))
    return loss, {'w_mean': jax.lax.stop_gradient(w_mean)}


def adam(cfg):
  """The reference's Adam for both networks: beta1 0, beta2 0.99, eps 1e-8."""
  return optax.adam(cfg['lr'], b1=0.0, b2=0.99, eps=1e-8)


def descend(loss_fn, params, opt_state, tx, dynamic_scale):
  """One optimizer step on loss_fn(params) -> (loss, aux); fp16 steps that overflow are skipped."""
  if dynamic_scale is None:
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    finite = None
  else:
    dynamic_scale, finite, (loss, aux), grads = dynamic_scale.value_and_grad(loss_fn, has_aux=True)(
      params
    )
  updates, new_opt_state = tx.update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  if finite is not None:
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    new_params, new_opt_state = keep(new_params, params), keep(new_opt_state, opt_state)
  return new_params, new_opt_state, dynamic_scale, loss, aux


def ema_beta(cfg, batch):
  """Gs's decay per step: a half-life of ema_kimg thousand images."""
  return 0.5 ** (batch / (cfg['ema_kimg'] * 1000.0))


def d_step(nets, tx, state, reals, rng):
  """Updates the discriminator on one batch of reals; the generator is fixed."""
  params = state.params
  scale_state = None if state.loss_scale is None else state.loss_scale['discriminator']
  scale = 1.0 if scale_state is None else scale_state.scale
  loss_fn = lambda d: nets.d_loss(d, params['generator'], reals, rng, scale)
  d_params, d_opt, scale_state, loss, aux = descend(
    loss_fn, params['discriminator'], state.opt_state['discriminator'], tx, scale_state
  )
  return (
    state.replace(
      params={**params, 'discriminator': d_params},
      opt_state={**state.opt_state, 'discriminator': d_opt},
      loss_scale=None
      if scale_state is None
      else {**state.loss_scale, 'discriminator': scale_state},
    ),
    loss,
    aux,
  )


def g_step(nets, tx, state, n, rng):
  """Updates the generator on `n` fresh latents; the discriminator is fixed."""
  params = state.params
  scale_state = None if state.loss_scale is None else state.loss_scale['generator']
  loss_fn = lambda g: nets.g_loss(g, params['discriminator'], n, rng)
  g_params, g_opt, scale_state, loss, aux = descend(
    loss_fn, params['generator'], state.opt_state['generator'], tx, scale_state
  )
  return (
    state.replace(
      params={**params, 'generator': g_params},
      opt_state={**state.opt_state, 'generator': g_opt},
      loss_scale=None if scale_state is None else {**state.loss_scale, 'generator': scale_state},
    ),
    loss,
    aux,
  )


def trainer(cfg, policy):
  """The custom GAN trainer: each step updates D and Gs (the EMA of G as it stands), then G.

  The reference runs Gs_update_op with D_train_op, before G_train_op: the average reads G
  before that iteration's G update.
  """
  nets = Nets(cfg, policy.compute_dtype)
  tx = adam(cfg)

  def init(rng):
    g_rng, d_rng, noise_rng = jax.random.split(rng, 3)
    r, z = cfg['resolution'], jnp.zeros((1, cfg['latent_size']), jnp.float32)
    g_params = nets.generator.init({'params': g_rng, 'dropout': noise_rng}, z)['params']
    d_params = nets.discriminator.init(d_rng, jnp.zeros((1, r, r, 3), jnp.float32))['params']
    params = {'generator': g_params, 'discriminator': d_params}
    scales = None
    if policy.loss_scaling:
      scales = {'generator': policy.initial_scale(), 'discriminator': policy.initial_scale()}
    return GANState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      ema=jax.tree.map(jnp.copy, g_params),
      w_avg=jnp.zeros((cfg['latent_size'],), jnp.float32),
      opt_state={k: tx.init(v) for k, v in params.items()},
      loss_scale=scales,
    )

  def step(state, batch, rng):
    rng = jax.random.fold_in(rng, state.step)
    d_rng, g_rng = jax.random.split(rng)
    reals = batch['images']
    n = reals.shape[0]
    state, d_loss, d_aux = d_step(nets, tx, state, reals, d_rng)
    beta = ema_beta(cfg, n)
    ema = jax.tree.map(
      lambda avg, p: beta * avg + (1.0 - beta) * p, state.ema, state.params['generator']
    )
    state, g_loss, g_aux = g_step(nets, tx, state, n, g_rng)
    # The reference updates dlatent_avg every time G runs in training: here twice a step.
    w_avg = state.w_avg
    for w_mean in (d_aux['w_mean'], g_aux['w_mean']):
      w_avg = cfg['dlatent_avg_beta'] * w_avg + (1.0 - cfg['dlatent_avg_beta']) * w_mean
    state = state.replace(step=state.step + 1, ema=ema, w_avg=w_avg)
    return state, {'loss': g_loss + d_loss, 'g_loss': g_loss, 'd_loss': d_loss, 'r1': d_aux['r1']}

  return wl.Trainer(
    init=init,
    make_batch=lambda rng, n: make_batch(cfg, rng, n),
    step=step,
    param_groups=lambda state: dict(state.params),
  )
