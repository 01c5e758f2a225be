"""The PyTorch peer of stylegan: StyleGAN (Karras et al. 2019) config F in torch.nn.

As models/stylegan/ (NVlabs/stylegan's G_style, G_mapping, G_synthesis and D_basic at the
'fixed' structure): the mapping network with lr multiplier 0.01, style mixing, per-layer noise,
AdaIN (instance norm then a style's scale and bias) after every synthesis convolution, the
[1, 2, 1] blur after each upsampling and before each downsampling, equalized learning rate
(weights N(0, 1) scaled at run time by gain / sqrt(fan_in)), and the minibatch-stddev
discriminator. One iteration is a D update (logistic loss with R1 on the reals), Gs (the
generator's moving average), then a G update (non-saturating); D and G each have their own Adam
(0, 0.99, 1e-8). The resampling convolutions from fused_min_res up are the original's: a
transposed or a strided convolution of the 4x4 kernel that sums the 3x3 kernel's four shifts.
"""

import copy
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from models.pytorch import gradfix
from models.pytorch import peer as peer_lib
from models.stylegan import train as jax_train
from models.stylegan.nets import log2_res, nf, num_layers

SQRT2 = math.sqrt(2.0)


def lrelu(x):
  return F.leaky_relu(x, 0.2)


def pixel_norm(x_NxD, eps=1e-8):
  """Normalizes each feature vector to unit root mean square."""
  return x_NxD * torch.rsqrt(x_NxD.square().mean(dim=-1, keepdim=True) + eps)


def instance_norm(x_NxCxHxW, eps=1e-8):
  """Per-image, per-channel normalization over H and W, in float32 as the reference does."""
  x = x_NxCxHxW.float()
  x = x - x.mean(dim=(2, 3), keepdim=True)
  x = x * torch.rsqrt(x.square().mean(dim=(2, 3), keepdim=True) + eps)
  return x.to(x_NxCxHxW.dtype)


def minibatch_stddev(x_NxCxHxW, group_size=4, num_features=1):
  """Appends the within-group standard deviation, averaged over features and pixels.

  The group is the largest divisor of the batch not above `group_size` (any batch works, as
  in the JAX workload); image i belongs to group i % M, as the reference's reshape assigns it.
  """
  n, c, h, w = x_NxCxHxW.shape
  g = max(d for d in range(1, min(group_size, n) + 1) if n % d == 0)
  y = x_NxCxHxW.float().reshape(g, n // g, num_features, c // num_features, h, w)
  y = torch.sqrt(y.var(dim=0, unbiased=False) + 1e-8)  # M x F x c x H x W
  y_MxF = y.mean(dim=(2, 3, 4))
  y_NxF = y_MxF.repeat(g, 1).to(x_NxCxHxW.dtype)
  return torch.cat([x_NxCxHxW, y_NxF[:, :, None, None].expand(n, num_features, h, w)], dim=1)


def summed_shifts(w_OxIx3x3):
  """The 4x4 kernel that sums the 3x3 kernel's four one-pixel shifts (the reference's fused
  resampling kernel)."""
  w = F.pad(w_OxIx3x3, (1, 1, 1, 1))
  return w[..., 1:, 1:] + w[..., :-1, 1:] + w[..., 1:, :-1] + w[..., :-1, :-1]


class Blur(nn.Module):
  """The [1, 2, 1] x [1, 2, 1] / 16 low-pass filter, a depthwise conv2d zero-padded to the same
  size."""

  def __init__(self, channels: int):
    super().__init__()
    f = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]) / 16.0
    kernel = torch.tensor(f, dtype=torch.float32).expand(channels, 1, 3, 3).contiguous()
    self.register_buffer('kernel', kernel, persistent=False)

  def forward(self, x_NxCxHxW):
    return gradfix.blur(x_NxCxHxW, self.kernel)


class EqDense(nn.Module):
  """Dense layer with equalized learning rate and a learning-rate multiplier."""

  def __init__(self, fan_in: int, features: int, gain=SQRT2, lrmul=1.0, bias=True):
    super().__init__()
    self.weight = nn.Parameter(torch.randn(features, fan_in) / lrmul)
    self.bias = nn.Parameter(torch.zeros(features)) if bias else None
    self.scale, self.lrmul = gain / math.sqrt(fan_in) * lrmul, lrmul

  def forward(self, x):
    bias = None if self.bias is None else self.bias * self.lrmul
    return F.linear(x, self.weight * self.scale, bias)


class EqConv(nn.Module):
  """KxK convolution with equalized learning rate; optionally 2x up- or downsampling.

  resample='up': nearest 2x upsampling then the convolution; 'down': the convolution then 2x2
  average pooling. `fused` (a 3x3 kernel) computes the same function as the reference does from
  128x128 up: upsampling as a stride-2 conv_transpose2d of the summed-shift kernel (of the
  spatially flipped kernel: the transpose scatters where the convolution gathers),
  downsampling as a stride-2 conv2d of the summed-shift kernel / 4.
  """

  def __init__(self, cin, cout, kernel=3, gain=SQRT2, resample=None, fused=False, bias=True):
    super().__init__()
    if fused and resample and kernel != 3:
      raise ValueError(f'a fused resampling convolution takes a 3x3 kernel, not {kernel}x{kernel}')
    self.weight = nn.Parameter(torch.randn(cout, cin, kernel, kernel))
    self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
    self.scale = gain / math.sqrt(kernel * kernel * cin)
    self.resample, self.fused = resample, fused

  def forward(self, x_NxCxHxW):
    w = self.weight * self.scale
    if self.resample == 'up' and self.fused:
      k = summed_shifts(w.flip(2, 3)).transpose(0, 1)  # conv_transpose2d's I x O x 4 x 4
      y = F.conv_transpose2d(x_NxCxHxW, k, stride=2, padding=1)
    elif self.resample == 'down' and self.fused:
      y = gradfix.conv2d(x_NxCxHxW, summed_shifts(w) * 0.25, stride=2, padding=1)
    else:
      x = x_NxCxHxW
      if self.resample == 'up':
        x = F.interpolate(x, scale_factor=2, mode='nearest')
      y = gradfix.conv2d(x, w, padding=w.shape[-1] // 2)
      if self.resample == 'down':
        y = F.avg_pool2d(y, 2)
    if self.bias is not None:
      y = y + self.bias[:, None, None]
    return y


class LayerEpilogue(nn.Module):
  """What ends every synthesis layer: noise, bias, lrelu, instance norm, style modulation.

  The noise is one fresh N(0, 1) image per example and layer, scaled per channel by a learned
  strength that starts at zero; the style (AdaIN's scale and bias) is a dense layer of W with
  gain 1.
  """

  def __init__(self, channels: int, latent: int):
    super().__init__()
    self.noise_strength = nn.Parameter(torch.zeros(channels))
    self.bias = nn.Parameter(torch.zeros(channels))
    self.style = EqDense(latent, 2 * channels, gain=1.0)

  def forward(self, x_NxCxHxW, w_NxD):
    n, c, h, w = x_NxCxHxW.shape
    noise = torch.randn(n, 1, h, w, device=x_NxCxHxW.device, dtype=x_NxCxHxW.dtype)
    x = x_NxCxHxW + noise * self.noise_strength[:, None, None] + self.bias[:, None, None]
    x = instance_norm(lrelu(x))
    style = self.style(w_NxD)[:, :, None, None]
    return x * (style[:, :c] + 1) + style[:, c:]


class Mapping(nn.Module):
  """Z -> W: pixel-norm of z, then mapping_layers dense layers with lr multiplier 0.01."""

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    d = cfg['latent_size']
    self.dense = nn.ModuleList(
      EqDense(d, d, lrmul=cfg['mapping_lrmul']) for _ in range(cfg['mapping_layers'])
    )

  def forward(self, z_NxZ):
    x = pixel_norm(z_NxZ)
    for layer in self.dense:
      x = lrelu(layer(x))
    return x


class Synthesis(nn.Module):
  """W (one per layer) -> image, from a learned 4x4 constant."""

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    d, c = cfg['latent_size'], nf(cfg, 1)
    self.const = nn.Parameter(torch.ones(1, c, 4, 4))
    self.conv_4 = EqConv(c, c, bias=False)
    self.up, self.blur, self.conv = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
    epilogues = [LayerEpilogue(c, d), LayerEpilogue(c, d)]
    for res in range(3, log2_res(cfg) + 1):
      cin, c = c, nf(cfg, res - 1)
      fused = 2**res >= cfg['fused_min_res']
      self.up.append(EqConv(cin, c, resample='up', fused=fused, bias=False))
      self.blur.append(Blur(c))
      self.conv.append(EqConv(c, c, bias=False))
      epilogues += [LayerEpilogue(c, d), LayerEpilogue(c, d)]
    self.epilogues = nn.ModuleList(epilogues)
    self.to_rgb = EqConv(c, 3, kernel=1, gain=1.0)

  def forward(self, w_NxLxD):
    e = self.epilogues
    x = self.const.expand(w_NxLxD.shape[0], -1, -1, -1)
    x = e[1](self.conv_4(e[0](x, w_NxLxD[:, 0])), w_NxLxD[:, 1])
    for i, (up, blur, conv) in enumerate(zip(self.up, self.blur, self.conv)):
      x = e[2 * i + 2](blur(up(x)), w_NxLxD[:, 2 * i + 2])
      x = e[2 * i + 3](conv(x), w_NxLxD[:, 2 * i + 3])
    return self.to_rgb(x)


class Generator(nn.Module):
  """G_style: mapping, style mixing, synthesis; no truncation in training.

  In training it tracks the batch mean of W in `w_avg` (the reference's dlatent_avg, the centre
  of the truncation trick when sampling), at every run as the JAX workload does.
  """

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    self.cfg, self.layers = cfg, num_layers(cfg)
    self.mapping = Mapping(cfg)
    self.synthesis = Synthesis(cfg)
    self.register_buffer('w_avg', torch.zeros(cfg['latent_size']))

  def forward(self, z_NxZ):
    cfg, n, layers = self.cfg, z_NxZ.shape[0], self.layers
    if self.training and cfg['style_mixing_prob'] > 0:
      w, w2 = self.mapping(torch.cat([z_NxZ, torch.randn_like(z_NxZ)])).split(n)  # one pass
      # One crossover per minibatch, as the reference: with probability p at a layer uniform
      # in [1, layers); the layers below it take w, the rest w2.
      u_mix, u_cut = torch.rand(2, device=z_NxZ.device).unbind()
      cut = (1 + (u_cut * (layers - 1)).floor().long()).clamp(max=layers - 1)
      cutoff = torch.where(u_mix < cfg['style_mixing_prob'], cut, layers)
      below = (torch.arange(layers, device=z_NxZ.device) < cutoff)[None, :, None]
      w_NxLxD = torch.where(below, w[:, None], w2[:, None])
    else:
      w = self.mapping(z_NxZ)
      w_NxLxD = w[:, None].expand(n, layers, -1)
    if self.training:
      with torch.no_grad():
        self.w_avg.lerp_(w.float().mean(dim=0), 1.0 - cfg['dlatent_avg_beta'])
    return self.synthesis(w_NxLxD)


class Discriminator(nn.Module):
  """D_basic: FromRGB, two convolutions per resolution down to 8x8, then the 4x4 head."""

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    top = log2_res(cfg)
    self.mbstd = (cfg['mbstd_group_size'], cfg['mbstd_features'])
    self.from_rgb = EqConv(3, nf(cfg, top - 1), kernel=1)
    self.conv0, self.blur, self.down = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
    for res in range(top, 2, -1):
      c, cout = nf(cfg, res - 1), nf(cfg, res - 2)
      self.conv0.append(EqConv(c, c))
      self.blur.append(Blur(c))
      fused = 2**res >= cfg['fused_min_res']
      self.down.append(EqConv(c, cout, resample='down', fused=fused))
    c = nf(cfg, 1)
    self.conv_4 = EqConv(c + cfg['mbstd_features'], c)
    self.dense0 = EqDense(16 * c, nf(cfg, 0))
    self.dense1 = EqDense(nf(cfg, 0), 1, gain=1.0)

  def forward(self, images_Nx3xHxW):
    x = lrelu(self.from_rgb(images_Nx3xHxW))
    for conv0, blur, down in zip(self.conv0, self.blur, self.down):
      x = lrelu(down(blur(lrelu(conv0(x)))))
    x = lrelu(self.conv_4(minibatch_stddev(x, *self.mbstd)))
    return self.dense1(lrelu(self.dense0(x.flatten(1))))[:, 0]


@torch.compiler.disable
def r1_penalty(discriminator, reals):
  """D(reals) and the per-image |grad_x D(reals)|^2, the input gradient taken with create_graph
  so that the update differentiates it. torch.compile leaves it eager: AOT autograd does not
  differentiate twice."""
  reals = reals.detach().requires_grad_(True)
  real_scores = discriminator(reals).float()
  (grads,) = torch.autograd.grad(real_scores.sum(), reals, create_graph=True)
  return real_scores, grads.float().square().sum(dim=(1, 2, 3))


def d_loss(generator, discriminator, reals, r1_gamma):
  """D_logistic_simplegp: softplus(D(fake)) + softplus(-D(real)) + gamma/2 * R1. The fakes come
  from G without a graph: only D is trained here."""
  with torch.no_grad():
    fakes = generator(
      torch.randn(reals.shape[0], generator.cfg['latent_size'], device=reals.device)
    )
  fake_scores = discriminator(fakes).float()
  real_scores, r1 = r1_penalty(discriminator, reals)
  return (F.softplus(fake_scores) + F.softplus(-real_scores) + r1 * (r1_gamma * 0.5)).mean()


def g_loss(generator, discriminator, n, device):
  """G_logistic_nonsaturating: softplus(-D(G(z))). D runs on detached copies of its weights:
  the gradient reaches G through D's input only, and D's weight gradients are not computed."""
  fakes = generator(torch.randn(n, generator.cfg['latent_size'], device=device))
  frozen = {k: v.detach() for k, v in discriminator.named_parameters()}
  scores = torch.func.functional_call(discriminator, frozen, (fakes,)).float()
  return F.softplus(-scores).mean()


class MovingAverage:
  """Gs, the reference's moving average of G (sampled from, not trained): each call moves it
  1 - beta of the way to G, beta a half-life of ema_kimg thousand images at the last batch's
  size (`images_per_step`, set by the D update). It runs after D's optimizer step, before G's
  update, as the reference runs Gs_update_op with D_train_op."""

  def __init__(self, generator: Generator, cfg: peer_lib.Config):
    self.average = copy.deepcopy(generator).requires_grad_(False).eval()
    self._params = list(generator.parameters())
    self._average_params = list(self.average.parameters())
    self.cfg, self.images_per_step = cfg, None

  @torch.no_grad()
  def __call__(self, *_):
    beta = jax_train.ema_beta(self.cfg, self.images_per_step)
    torch._foreach_lerp_(self._average_params, self._params, 1.0 - beta)


def build_with_average(cfg: peer_lib.Config, device: torch.device):
  """(the Setup, Gs): build's, with Gs, which the D optimizer steps and nothing else reaches."""
  with torch.device(device):
    generator, discriminator = Generator(cfg), Discriminator(cfg)
  generator.train()
  discriminator.train()
  generator_ema = MovingAverage(generator, cfg)
  adam = lambda m: torch.optim.Adam(m.parameters(), lr=cfg['lr'], betas=(0.0, 0.99), eps=1e-8)
  d_optimizer = adam(discriminator)
  d_optimizer.register_step_post_hook(generator_ema)

  def discriminator_loss(batch, step):
    del step
    reals = batch['images']
    generator_ema.images_per_step = reals.shape[0]
    return d_loss(generator, discriminator, reals, cfg['r1_gamma'])

  def generator_loss(batch, step):
    del step
    reals = batch['images']
    return g_loss(generator, discriminator, reals.shape[0], reals.device)

  setup = peer_lib.Setup(
    modules={'generator': generator, 'discriminator': discriminator},
    updates=[
      peer_lib.Update(discriminator_loss, d_optimizer),
      peer_lib.Update(generator_loss, adam(generator)),
    ],
  )
  return setup, generator_ema


def build(cfg: peer_lib.Config, device: torch.device) -> peer_lib.Setup:
  return build_with_average(cfg, device)[0]


def smooth_images(coarse_Nx3x4x4, grain_Nx3xRxR):
  """A coarse pattern resized bilinearly to the grain's size, plus 0.05 x the grain, in [-1, 1]."""
  size = grain_Nx3xRxR.shape[-2:]
  images = F.interpolate(coarse_Nx3x4x4, size=size, mode='bilinear', align_corners=False)
  return (images + 0.05 * grain_Nx3xRxR).clamp(-1.0, 1.0)


def make_batch(cfg, n, generator, device):
  """Smooth random colour images in [-1, 1], NCHW float32, as the JAX make_batch draws them: a
  U(-1, 1) 4x4 pattern resized, plus N(0, 0.05^2) grain."""
  r = cfg['resolution']
  coarse = torch.rand(n, 3, 4, 4, generator=generator, device=device) * 2.0 - 1.0
  grain = torch.randn(n, 3, r, r, generator=generator, device=device)
  return {'images': smooth_images(coarse, grain)}


STYLEGAN = peer_lib.Peer(
  name='stylegan',
  build=build,
  make_batch=make_batch,
  source='written from torch.nn layers (NVlabs/stylegan networks_stylegan G_style and D_basic, '
  'fixed structure); fused resampling as conv_transpose2d and strided conv2d of the summed-shift '
  'kernel, the blur as a depthwise conv2d (the config\'s depthwise key does not apply); the '
  'discriminator\'s convolutions and blurs with hand-written derivatives for R1\'s second '
  'derivative, as stylegan2-ada-pytorch\'s conv2d_gradfix',
  differences=(
    'images are NCHW (the JAX batch is NHWC)',
    "under fp16, R1's input gradient is taken unscaled (the loss does not see the gradient "
    "scaler's scale; the JAX workload scales it and divides the scale out)",
  ),
)
