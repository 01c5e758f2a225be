"""Pix2PixHD (Wang et al. 2018) at 2048x1024: one step updates the generator and discriminators.

The training iteration of NVIDIA/pix2pixHD (train.py, pix2pixHD_model.py, pool_size 0) under
the 2020 command's `--instance_feat --load_features --niter_fix_global 10`: the generator reads
the one-hot labels, the instance edge map and 3 precomputed instance-feature channels; the
discriminators read the labels, the edges and an image. The generator's loss is LSGAN +
discriminator feature matching + VGG19 perceptual loss (both weighted 10); the discriminators'
loss is LSGAN on real and (detached) fake pairs, halved. Both gradients are taken at the same
parameters, then Adam steps each network, as the reference's two optimizers do. For the first
niter_fix_global epochs, the ones a benchmark times, the generator's Adam holds only the local
enhancer: the global generator's gradients are computed but never applied.
"""

from typing import Any, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models import workload as wl
from models.pix2pixhd import data as pix2pixhd_data
from models.pix2pixhd import nets as nets_lib
from models.pix2pixhd import vgg

NETWORKS = ('generator', 'discriminator')


class Nets(NamedTuple):
  generator: nn.Module
  discriminator: nn.Module
  vgg: nn.Module


def build(cfg, dtype=jnp.float32) -> Nets:
  generator, discriminator = nets_lib.build(cfg, dtype)
  return Nets(generator, discriminator, vgg.VGG19Features(cfg['vgg_base'], dtype))


# -------------------------------------------------------------------------- losses


def lsgan(predictions, target):
  """GANLoss(use_lsgan=True): MSE of each scale's patch scores to the target, summed."""
  return sum(jnp.mean((feats[-1].astype(jnp.float32) - target) ** 2) for feats in predictions)


def feature_matching(fake, real, n_layers):
  """L1 between every intermediate discriminator feature, weighted as the reference."""
  weight = (4.0 / (n_layers + 1)) / len(fake)
  total = jnp.float32(0.0)
  for fake_scale, real_scale in zip(fake, real):
    for a, b in zip(fake_scale[:-1], real_scale[:-1]):
      total += weight * jnp.mean(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
  return total


def losses(nets: Nets, cfg, params, vgg_params, batch):
  """(g_loss + d_loss, metrics) at `params` = {'generator', 'discriminator'}.

  Stop-gradients make the sum's gradient the generator's loss gradient for the
  generator and the discriminators' loss gradient for the discriminators: one
  backward pass computes what the reference's two backward calls do. Freezing one
  network is then just not applying its half of the gradient.
  """
  dtype = nets.generator.dtype
  sg = jax.lax.stop_gradient
  generator_input, condition = pix2pixhd_data.encode_input(cfg, batch, dtype)
  real = batch['image'].astype(dtype)
  fake = nets.generator.apply({'params': params['generator']}, generator_input)

  def discriminate(d_params, image):
    pair = jnp.concatenate([condition, image.astype(dtype)], axis=-1)
    return nets.discriminator.apply({'params': d_params}, pair)

  pred_fake_detached = discriminate(params['discriminator'], sg(fake))
  pred_real = discriminate(params['discriminator'], batch['image'])
  d_fake, d_real = lsgan(pred_fake_detached, 0.0), lsgan(pred_real, 1.0)
  d_loss = 0.5 * (d_fake + d_real)

  pred_fake = discriminate(sg(params['discriminator']), fake)
  g_gan = lsgan(pred_fake, 1.0)
  g_feat = cfg['lambda_feat'] * feature_matching(pred_fake, sg(pred_real), cfg['n_layers_D'])
  g_vgg = cfg['lambda_feat'] * vgg.perceptual_loss(nets.vgg, vgg_params, fake, real)
  g_loss = g_gan + g_feat + g_vgg
  return g_loss + d_loss, {
    'g_loss': g_loss,
    'd_loss': d_loss,
    'g_gan': g_gan,
    'g_feat': g_feat,
    'g_vgg': g_vgg,
    'd_real': d_real,
    'd_fake': d_fake,
  }


# ------------------------------------------------------------------------- trainer


@flax.struct.dataclass
class GANState:
  """Both networks' parameters and Adam states; the fixed VGG19 rides along untrained."""

  step: jax.Array
  params: Any  # {'generator': ..., 'discriminator': ...}
  opt_state: Any  # the same two keys, over the parameters each optimizer holds (`held`)
  vgg_params: Any
  loss_scale: Any  # flax DynamicScale under fp16, else None
  # While the global generator is fixed: its gradients, summed over the steps. PyTorch computes
  # them (requires_grad stays set) into .grad, which no optimizer zeroes; kept here, they are
  # computed as there, where an unused gradient would be left out of the program. Else None.
  global_grads: Any


def optimizer(cfg):
  return optax.adam(cfg['lr'], b1=cfg['beta1'], b2=0.999)


GLOBAL = 'global'  # the global generator's parameters inside the generator's


def fixes_global(cfg):
  """Whether the timed steps hold the global generator fixed: they are the first of training,
  inside the niter_fix_global epochs whenever there are any."""
  return cfg['niter_fix_global'] > 0


def held(cfg, net, params):
  """The parameters of `net` that its Adam holds: while the global generator is fixed, the
  generator's local enhancer alone (pix2pixHD's optimizer_G takes the parameters named model1_*,
  leaving the global generator's `model`); else all of them."""
  if net == 'generator' and fixes_global(cfg):
    return {k: v for k, v in params.items() if k != GLOBAL}
  return params


def _normal_tree(rng, shapes, kernel_std):
  """Parameters of these shapes from ONE normal draw: kernels scaled, biases zero.

  XLA on CPU compiles every random draw on its own and slowly (seconds each); one draw for
  the ~90 kernels keeps the compile of init short.
  """
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  is_kernel = [path[-1].key == 'kernel' for path, _ in leaves]
  total = sum(leaf.size for (_, leaf), k in zip(leaves, is_kernel) if k)
  flat = jax.random.normal(rng, (total,), jnp.float32)
  out, offset = [], 0
  for (_, leaf), k in zip(leaves, is_kernel):
    if k:
      out.append(kernel_std(leaf.shape) * flat[offset : offset + leaf.size].reshape(leaf.shape))
      offset += leaf.size
    else:
      out.append(jnp.zeros(leaf.shape, leaf.dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def param_shapes(nets: Nets, cfg):
  """({'generator', 'discriminator'}, vgg) parameter shapes, without computing anything."""
  side = 2 ** (cfg['n_downsample_global'] + 3)  # convolution shapes ignore the image size
  h, w = min(cfg['height'], side), min(cfg['width'], side)
  in_ch, key = cfg['label_nc'] + 1, jax.random.key(0)  # the labels and the edge map
  shapes = lambda module, ch: jax.eval_shape(
    module.init, key, jax.ShapeDtypeStruct((1, h, w, ch), jnp.float32)
  )['params']
  return (
    {
      'generator': shapes(nets.generator, in_ch + cfg['feat_num']),
      'discriminator': shapes(nets.discriminator, in_ch + cfg['output_nc']),
    },
    shapes(nets.vgg, 3),
  )


def init_params(nets: Nets, cfg, rng):
  """Trained parameters as the modules declare them: N(0, 0.02) kernels (pix2pixHD's
  weights_init), zero biases; and the fixed VGG19's He-normal parameters."""
  params_rng, vgg_rng = jax.random.split(rng)
  params, vgg_params = param_shapes(nets, cfg)
  return (
    _normal_tree(params_rng, params, lambda shape: nets_lib.KERNEL_STD),
    _normal_tree(vgg_rng, vgg_params, vgg.kernel_std),
  )


def trainer(cfg, policy) -> wl.Trainer:
  nets = build(cfg, policy.compute_dtype)
  tx = optimizer(cfg)

  def init(rng):
    params, vgg_params = init_params(nets, cfg, rng)
    frozen = params['generator'][GLOBAL]
    return GANState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state={k: tx.init(held(cfg, k, params[k])) for k in NETWORKS},
      vgg_params=vgg_params,
      loss_scale=policy.initial_scale(),
      global_grads=jax.tree.map(jnp.zeros_like, frozen) if fixes_global(cfg) else None,
    )

  def step(state, batch, rng):
    del rng  # pix2pixHD's iteration draws nothing at random (no dropout, no noise, pool 0)
    loss_fn = lambda params: losses(nets, cfg, params, state.vgg_params, batch)
    if state.loss_scale is None:
      (value, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
      finite, loss_scale = None, None
    else:
      loss_scale, finite, (value, metrics), grads = state.loss_scale.value_and_grad(
        loss_fn, has_aux=True
      )(state.params)
    params, opt_state = {}, {}
    for k in NETWORKS:
      mine = held(cfg, k, state.params[k])
      updates, opt_state[k] = tx.update(held(cfg, k, grads[k]), state.opt_state[k], mine)
      params[k] = {**state.params[k], **optax.apply_updates(mine, updates)}
    global_grads = state.global_grads
    if global_grads is not None:
      global_grads = jax.tree.map(jnp.add, global_grads, grads['generator'][GLOBAL])
    if finite is not None:
      # A step whose scaled gradients overflowed changes nothing but the scale.
      keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
      params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
      global_grads = keep(global_grads, state.global_grads)
    new_state = state.replace(
      step=state.step + 1,
      params=params,
      opt_state=opt_state,
      loss_scale=loss_scale,
      global_grads=global_grads,
    )
    return new_state, {'loss': value, **metrics}

  return wl.Trainer(
    init=init,
    make_batch=lambda rng, n: pix2pixhd_data.make_batch(cfg, rng, n),
    step=step,
    param_groups=lambda state: {k: state.params[k] for k in NETWORKS},
  )


def flops_per_example(cfg):
  """Training FLOPs of one image (convolutions; norms, pools and losses are negligible).

  Generator forward + backward: 3 G. Discriminators: the fake and real passes of
  their own loss, forward + backward, 6 D; the fake pass of the generator's loss,
  forward + input gradients only (their weights are held), 2 D. VGG19: the fake
  image forward + input gradients, 2 V; the real image forward, 1 V.
  """
  g = nets_lib.generator_flops(cfg)
  d = nets_lib.discriminator_flops(cfg)
  v = vgg.flops(cfg['height'], cfg['width'], cfg['vgg_base'])
  return 3 * g + 8 * d + 3 * v


def check(cfg):
  """Sizes that halve evenly down to the global generator's coarsest map, of 2 pixels or more."""
  h, w, n = cfg['height'], cfg['width'], cfg['n_downsample_global'] + 1
  return wl.first(
    (
      h % 2**n or w % 2**n or min(h, w) < 2 ** (n + 1),
      f'height and width ({h}, {w}) must be multiples of 2**(n_downsample_global + 1) = {2**n} '
      f'and at least {2 ** (n + 1)}',
    ),
  )


PIX2PIXHD = wl.Workload(
  name='pix2pixhd',
  description='Pix2PixHD local enhancer, 2048x1024 Cityscapes-like label maps, G and D steps',
  unit='images',
  throughput_unit='images/s',
  config=dict(
    height=1024,
    width=2048,
    label_nc=35,
    # --instance_feat --load_features: 3 precomputed instance-feature channels (feat_num).
    feat_num=3,
    # --niter_fix_global 10: for the first 10 epochs, where the timed steps fall, the generator's
    # Adam holds only the local enhancer; 0: every parameter, as after them.
    niter_fix_global=10,
    output_nc=3,
    # netG=local: the global generator runs at ngf*2 = 64 on the half-size input.
    ngf=32,
    n_downsample_global=4,
    n_blocks_global=9,
    n_blocks_local=3,
    ndf=64,
    n_layers_D=3,
    num_D=3,
    vgg_base=64,
    lambda_feat=10.0,
    lr=2e-4,
    beta1=0.5,
    shapes=24,  # painted objects per synthetic label map
  ),
  # Every stage kept but the fewest layers: XLA's CPU compile time grows with the
  # layer count (about 30 s of CPU for this step), not with the image size.
  tiny=dict(
    height=32,
    width=64,
    ngf=4,
    n_downsample_global=1,
    n_blocks_global=1,
    n_blocks_local=1,
    ndf=8,
    n_layers_D=2,
    num_D=2,
    vgg_base=8,
    shapes=6,
    lr=1e-3,
  ),
  # VGG's loss sees RGB; feat_num 0 runs without instance features.
  spec=dict(
    output_nc=wl.Key(choices=(3,)),
    beta1=wl.FRACTION,
    feat_num=wl.NATURAL,
    niter_fix_global=wl.NATURAL,
  ),
  check=check,
  trainer=trainer,
  flops_per_example=flops_per_example,
  default_precision='fp32',
  family='image',
  adversarial=True,
  # 2: the generator upsamples with 2x2 convolutions to the four output phases (revision 1 ran
  # transposed convolutions). 3: the generator reads 3 instance-feature channels, and Adam holds
  # only its local enhancer (2 read 36 channels and held every parameter).
  revision=3,
)
