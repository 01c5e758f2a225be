"""StyleGAN (Karras et al. 2019, "A Style-Based Generator Architecture for GANs"), config F.

As NVlabs/stylegan's networks_stylegan.py (G_style, G_mapping, G_synthesis,
D_basic) and its FFHQ training setup: non-saturating logistic G loss, logistic
D loss with R1 (gamma 10), Adam (0, 0.99, 1e-8), lr 0.003 at 1024 (train.py's
G_lrate_dict and D_lrate_dict), and Gs, the moving average of G with
beta = 0.5 ** (batch / 10k images). The original grew progressively; this
trains the 1024x1024 network directly (the reference's 'fixed' structure:
only the last ToRGB and the first FromRGB exist).
"""

import math
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxbench import workload as wl
from models import stylegan_layers as sl


def nf(cfg, stage):
  """Feature maps at a stage: fmap_base / 2**stage, at most fmap_max."""
  return min(int(cfg['fmap_base'] / 2.0**stage), cfg['fmap_max'])


def log2_res(cfg):
  r = int(math.log2(cfg['resolution']))
  assert cfg['resolution'] == 2**r and r >= 3, cfg['resolution']
  return r


def num_layers(cfg):
  """Synthesis layers (and styles): two per resolution from 4x4 up."""
  return 2 * log2_res(cfg) - 2


class Mapping(nn.Module):
  """Z -> W: pixel-norm of z, then 8 dense layers with lr multiplier 0.01."""

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, z_NxZ):
    x = sl.pixel_norm(z_NxZ.astype(self.dtype))
    for i in range(self.cfg['mapping_layers']):
      x = sl.lrelu(
        sl.EqDense(
          self.cfg['latent_size'],
          lrmul=self.cfg['mapping_lrmul'],
          dtype=self.dtype,
          name=f'dense_{i}',
        )(x)
      )
    return x


class Synthesis(nn.Module):
  """W (one per layer) -> image, from a learned 4x4 constant."""

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, w_NxLxD, noise_NxP):
    cfg, dtype = self.cfg, self.dtype
    n = w_NxLxD.shape[0]
    offsets = [0]
    for size in noise_sizes(cfg):
      offsets.append(offsets[-1] + size * size)

    def epilogue(i, x):
      size = x.shape[1]
      noise = noise_NxP[:, offsets[i] : offsets[i + 1]].reshape(n, size, size, 1)
      return sl.LayerEpilogue(dtype, name=f'epilogue_{i}')(x, w_NxLxD[:, i], noise)

    const = self.param('const', nn.initializers.ones, (4, 4, nf(cfg, 1)))
    x = epilogue(0, jnp.broadcast_to(const.astype(dtype), (n, 4, 4, nf(cfg, 1))))
    x = epilogue(1, sl.EqConv(nf(cfg, 1), use_bias=False, dtype=dtype, name='conv_4')(x))
    for res in range(3, log2_res(cfg) + 1):
      size = 2**res
      x = sl.EqConv(
        nf(cfg, res - 1),
        resample='up',
        fused=size >= cfg['fused_min_res'],
        use_bias=False,
        dtype=dtype,
        name=f'conv0_up_{size}',
      )(x)
      x = epilogue(2 * res - 4, sl.blur(x))
      x = sl.EqConv(nf(cfg, res - 1), use_bias=False, dtype=dtype, name=f'conv1_{size}')(x)
      x = epilogue(2 * res - 3, x)
    return sl.EqConv(3, kernel=1, gain=1.0, dtype=dtype, name='to_rgb')(x)


def noise_sizes(cfg):
  """The side of each synthesis layer's noise image."""
  return [2 ** (i // 2 + 2) for i in range(num_layers(cfg))]


class Generator(nn.Module):
  """G_style: mapping, style mixing (training), synthesis; no truncation in training.

  Returns the images and the batch mean of W, which the trainer tracks as the
  reference's dlatent_avg (the centre of the truncation trick when sampling).
  Every random draw comes from the 'dropout' rng stream, in few calls: each
  jax.random call is a threefry kernel, slow to compile on CPU.
  """

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, z_NxZ, train=True):
    cfg = self.cfg
    (n, zdim), layers = z_NxZ.shape, num_layers(cfg)
    mixing = train and cfg['style_mixing_prob'] > 0
    normal_rng, uniform_rng = jax.random.split(self.make_rng('dropout'))
    # The noise images of all layers and the mixing latent z2, in one draw.
    pixels = sum(size * size for size in noise_sizes(cfg))
    normals = jax.random.normal(normal_rng, (n, pixels + (zdim if mixing else 0)), jnp.float32)
    noise_NxP = normals[:, :pixels]
    mapping = Mapping(cfg, self.dtype, name='mapping')
    if mixing:
      w_both = mapping(jnp.concatenate([z_NxZ, normals[:, pixels:]], axis=0))  # one pass
      w, w2 = w_both[:n], w_both[n:]
      # One crossover per minibatch, as the reference: it mixes with probability p at a
      # layer uniform in [1, layers); layers below it take w, the rest w2.
      u_mix, u_cut = jax.random.uniform(uniform_rng, (2,))
      cut = jnp.minimum(1 + jnp.floor(u_cut * (layers - 1)).astype(jnp.int32), layers - 1)
      cutoff = jnp.where(u_mix < cfg['style_mixing_prob'], cut, layers)
      w_NxLxD = jnp.where((jnp.arange(layers) < cutoff)[None, :, None], w[:, None], w2[:, None])
    else:
      w = mapping(z_NxZ)
      w_NxLxD = jnp.broadcast_to(w[:, None], (n, layers, w.shape[-1]))
    images = Synthesis(cfg, self.dtype, name='synthesis')(w_NxLxD, noise_NxP)
    return images, jnp.mean(w.astype(jnp.float32), axis=0)


class Discriminator(nn.Module):
  """D_basic: FromRGB, two convolutions per resolution down to 8x8, then the 4x4 head."""

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images_NxHxWx3):
    cfg, dtype, top = self.cfg, self.dtype, log2_res(self.cfg)
    x = sl.lrelu(
      sl.EqConv(nf(cfg, top - 1), kernel=1, dtype=dtype, name='from_rgb')(images_NxHxWx3)
    )
    for res in range(top, 2, -1):
      size = 2**res
      x = sl.lrelu(sl.EqConv(nf(cfg, res - 1), dtype=dtype, name=f'conv0_{size}')(x))
      x = sl.EqConv(
        nf(cfg, res - 2),
        resample='down',
        fused=size >= cfg['fused_min_res'],
        dtype=dtype,
        name=f'conv1_down_{size}',
      )(sl.blur(x))
      x = sl.lrelu(x)
    x = sl.minibatch_stddev(x, cfg['mbstd_group_size'], cfg['mbstd_features'])
    x = sl.lrelu(sl.EqConv(nf(cfg, 1), dtype=dtype, name='conv_4')(x))
    x = x.reshape(x.shape[0], -1)
    x = sl.lrelu(sl.EqDense(nf(cfg, 0), dtype=dtype, name='dense0')(x))
    return sl.EqDense(1, gain=1.0, dtype=dtype, name='dense1')(x)[:, 0]


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
  """The custom GAN trainer: each step updates D, then G, then Gs (the EMA)."""
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
    state, g_loss, g_aux = g_step(nets, tx, state, n, g_rng)
    beta = ema_beta(cfg, n)
    ema = jax.tree.map(
      lambda avg, p: beta * avg + (1.0 - beta) * p, state.ema, state.params['generator']
    )
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


def _conv(k, cin, cout, hw):
  return 2.0 * k * k * cin * cout * hw


def generator_flops(cfg):
  """Forward FLOPs per image: both mapping passes (mixing), convolutions, styles, blurs."""
  d, top = cfg['latent_size'], log2_res(cfg)
  flops = 2 * cfg['mapping_layers'] * 2.0 * d * d  # the mixing latent is mapped too
  style = lambda c: 2.0 * d * 2 * c
  flops += _conv(3, nf(cfg, 1), nf(cfg, 1), 16) + 2 * style(nf(cfg, 1))
  cin = nf(cfg, 1)
  for res in range(3, top + 1):
    c, hw = nf(cfg, res - 1), 4**res
    if 2**res >= cfg['fused_min_res']:
      flops += _conv(4, cin, c, hw // 4)  # the 4x4 kernel on the input grid
    else:
      flops += _conv(3, cin, c, hw)
    flops += 2.0 * 9 * c * hw + _conv(3, c, c, hw) + 2 * style(c)  # blur, conv1, two styles
    cin = c
  return flops + _conv(1, cin, 3, 4**top)


def discriminator_flops(cfg):
  """Forward FLOPs per image: FromRGB, convolutions, blurs, the dense head."""
  top = log2_res(cfg)
  flops = _conv(1, 3, nf(cfg, top - 1), 4**top)
  for res in range(top, 2, -1):
    c, cout, hw = nf(cfg, res - 1), nf(cfg, res - 2), 4**res
    flops += _conv(3, c, c, hw) + 2.0 * 9 * c * hw
    if 2**res >= cfg['fused_min_res']:
      flops += _conv(4, c, cout, hw // 4)
    else:
      flops += _conv(3, c, cout, hw)
  c = nf(cfg, 1)
  return flops + _conv(3, c + 1, c, 16) + 2.0 * 16 * c * nf(cfg, 0) + 2.0 * nf(cfg, 0)


def flops_per_example(cfg):
  """Training FLOPs per image of one D step plus one G step.

  With G and D the forward costs: the D step runs G forward (G_f), D on the
  fakes forward and backward (3 D_f), and the reals through D forward and
  input-gradient (2 D_f) then that whole graph backward (4 D_f) for R1; the
  G step is G forward and backward (3 G_f) and D forward and input-gradient
  (2 D_f). In all 4 G_f + 11 D_f.
  """
  return 4.0 * generator_flops(cfg) + 11.0 * discriminator_flops(cfg)


STYLEGAN_CONFIG = dict(
  resolution=1024,
  fmap_base=8192,
  fmap_max=512,
  latent_size=512,
  mapping_layers=8,
  mapping_lrmul=0.01,
  style_mixing_prob=0.9,
  mbstd_group_size=4,
  mbstd_features=1,
  fused_min_res=128,
  r1_gamma=10.0,
  lr=0.003,
  ema_kimg=10.0,
  dlatent_avg_beta=0.995,
)
# 8x8 keeps one block of each kind (XLA's CPU compile time grows with the layer count);
# fused_min_res=8 runs the fused resampling convolutions the full size uses from 128 up.
STYLEGAN_TINY = dict(
  resolution=8, fmap_base=64, fmap_max=16, latent_size=16, mapping_layers=2, fused_min_res=8
)

STYLEGAN = wl.Workload(
  name='stylegan',
  description='StyleGAN v1 config F at 1024x1024: D step with R1, G step, EMA of G',
  unit='images',
  throughput_unit='images/s',
  config=STYLEGAN_CONFIG,
  tiny=STYLEGAN_TINY,
  trainer=trainer,
  flops_per_example=flops_per_example,
  default_precision='fp32',
  family='image',
  adversarial=True,
)
