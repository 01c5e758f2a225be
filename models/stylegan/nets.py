"""StyleGAN (Karras et al. 2019) networks: G_mapping, G_synthesis, G_style and D_basic."""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.stylegan import layers as sl


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
      x = epilogue(2 * res - 4, sl.blur(x, cfg['depthwise']))
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
      )(sl.blur(x, cfg['depthwise']))
      x = sl.lrelu(x)
    x = sl.minibatch_stddev(x, cfg['mbstd_group_size'], cfg['mbstd_features'])
    x = sl.lrelu(sl.EqConv(nf(cfg, 1), dtype=dtype, name='conv_4')(x))
    x = x.reshape(x.shape[0], -1)
    x = sl.lrelu(sl.EqDense(nf(cfg, 0), dtype=dtype, name='dense0')(x))
    return sl.EqDense(1, gain=1.0, dtype=dtype, name='dense1')(x)[:, 0]
