"""The PyTorch peer of pix2pixhd: pix2pixHD's local enhancer and multiscale PatchGAN in torch.nn.

As models/pix2pixhd/ (NVIDIA/pix2pixHD's networks.py, netG=local, norm=instance, under the 2020
command's --instance_feat --load_features --niter_fix_global 10): the generator reads one-hot
labels, the instance edge map and the instance features; the discriminators read the labels,
the edges and an image. One iteration is one update: the generator's loss (LSGAN, feature
matching and a fixed VGG19's perceptual loss) plus the discriminators' (LSGAN on real and
detached fake pairs, halved), both taken at the same parameters, then one Adam step over what
the reference's two Adams hold (Adam is per parameter: one optimizer with both networks' groups
is the two). While the global generator is fixed, its parameters keep requires_grad and
accumulate gradients that no optimizer applies or zeroes, as in the reference.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.pix2pixhd import pix2pixhd as jax_pix2pixhd
from models.pix2pixhd import vgg as jax_vgg
from models.pytorch import peer as peer_lib

KERNEL_STD = 0.02  # pix2pixHD's weights_init


def _conv(cin, cout, k, stride=1, padding=0, transpose=False):
  if transpose:  # pix2pixHD's ConvTranspose2d(3, stride 2, padding 1, output_padding 1)
    layer = nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1)
  else:
    layer = nn.Conv2d(cin, cout, k, stride=stride, padding=padding)
  nn.init.normal_(layer.weight, std=KERNEL_STD)
  nn.init.zeros_(layer.bias)
  return layer


def norm(x):
  """InstanceNorm2d without affine parameters."""
  return F.instance_norm(x, eps=1e-5)


def reflect_pad(x, p):
  return F.pad(x, (p, p, p, p), mode='reflect')


def downsample(x):
  """The input pyramid: AvgPool2d(3, stride 2, padding 1, count_include_pad=False)."""
  return F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False)


class ResnetBlock(nn.Module):
  """x + IN(conv3(pad(relu(IN(conv3(pad(x)))))))."""

  def __init__(self, ch):
    super().__init__()
    self.conv1, self.conv2 = _conv(ch, ch, 3), _conv(ch, ch, 3)

  def forward(self, x):
    y = F.relu(norm(self.conv1(reflect_pad(x, 1))))
    return x + norm(self.conv2(reflect_pad(y, 1)))


class GlobalTrunk(nn.Module):
  """The global generator without its final 7x7 convolution and tanh (dropped by netG=local)."""

  def __init__(self, cin, ngf, n_downsample, n_blocks):
    super().__init__()
    self.stem = _conv(cin, ngf, 7)
    self.down = nn.ModuleList(
      _conv(ngf * 2**i, ngf * 2 ** (i + 1), 3, 2, 1) for i in range(n_downsample)
    )
    self.blocks = nn.ModuleList(ResnetBlock(ngf * 2**n_downsample) for _ in range(n_blocks))
    self.up = nn.ModuleList(
      _conv(ngf * 2 ** (n_downsample - i), ngf * 2 ** (n_downsample - i - 1), 3, transpose=True)
      for i in range(n_downsample)
    )

  def forward(self, x):
    x = F.relu(norm(self.stem(reflect_pad(x, 3))))
    for layer in self.down:
      x = F.relu(norm(layer(x)))
    for block in self.blocks:
      x = block(x)
    for layer in self.up:
      x = F.relu(norm(layer(x)))
    return x


class LocalEnhancer(nn.Module):
  """The global generator (ngf*2, at half resolution) inside the enhancer (ngf, full); returns a
  tanh image."""

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    cin, ngf = cfg['label_nc'] + 1 + cfg['feat_num'], cfg['ngf']
    self.global_trunk = GlobalTrunk(
      cin, 2 * ngf, cfg['n_downsample_global'], cfg['n_blocks_global']
    )
    self.local_stem = _conv(cin, ngf, 7)
    self.local_down = _conv(ngf, 2 * ngf, 3, 2, 1)
    self.local_blocks = nn.ModuleList(ResnetBlock(2 * ngf) for _ in range(cfg['n_blocks_local']))
    self.local_up = _conv(2 * ngf, ngf, 3, transpose=True)
    self.out = _conv(ngf, cfg['output_nc'], 7)

  def forward(self, x):
    g = self.global_trunk(downsample(x))
    y = F.relu(norm(self.local_stem(reflect_pad(x, 3))))
    y = F.relu(norm(self.local_down(y))) + g
    for block in self.local_blocks:
      y = block(y)
    y = F.relu(norm(self.local_up(y)))
    return torch.tanh(self.out(reflect_pad(y, 3)))


class NLayerDiscriminator(nn.Module):
  """The PatchGAN: every layer's output, for feature matching (getIntermFeat)."""

  def __init__(self, cin, ndf, n_layers):
    super().__init__()
    layers, nf = [_conv(cin, ndf, 4, 2, 2)], ndf
    for n in range(1, n_layers + 1):
      cin, nf = nf, min(nf * 2, 512)
      layers.append(_conv(cin, nf, 4, 2 if n < n_layers else 1, 2))
    layers.append(_conv(nf, 1, 4, 1, 2))  # patch scores, no sigmoid (LSGAN)
    self.layers = nn.ModuleList(layers)

  def forward(self, x):
    feats = [F.leaky_relu(self.layers[0](x), 0.2)]
    for layer in self.layers[1:-1]:
      feats.append(F.leaky_relu(norm(layer(feats[-1])), 0.2))
    feats.append(self.layers[-1](feats[-1]))
    return feats


class MultiscaleDiscriminator(nn.Module):
  """num_D PatchGANs on the input, then on its 2x and 4x average-pooled copies."""

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    cin = cfg['label_nc'] + 1 + cfg['output_nc']
    self.scales = nn.ModuleList(
      NLayerDiscriminator(cin, cfg['ndf'], cfg['n_layers_D']) for _ in range(cfg['num_D'])
    )

  def forward(self, x):
    results = []
    for i, scale in enumerate(self.scales):
      if i:
        x = downsample(x)
      results.append(scale(x))
    return results


class VGG19Features(nn.Module):
  """torchvision's vgg19().features up to relu5_1, returning relu1_1 .. relu5_1; random He-normal
  kernels and zero biases, fixed (pix2pixHD's VGGLoss needs no pretrained weights to be timed)."""

  def __init__(self, base: int):
    super().__init__()
    self.stages, cin = nn.ModuleList(), 3
    for convs, mult in zip(jax_vgg.STAGE_CONVS, jax_vgg.STAGE_WIDTHS):
      stage = nn.ModuleList()
      for _ in range(convs):
        conv = nn.Conv2d(cin, base * mult, 3, padding=1)
        nn.init.normal_(conv.weight, std=math.sqrt(2.0 / (9 * cin)))
        nn.init.zeros_(conv.bias)
        stage.append(conv)
        cin = base * mult
      self.stages.append(stage)
    self.requires_grad_(False)

  def forward(self, x):
    features = []
    for i, stage in enumerate(self.stages):
      if i:
        x = F.max_pool2d(x, 2)
      for j, conv in enumerate(stage):
        x = F.relu(conv(x))
        if j == 0:
          features.append(x)
    return features


def perceptual_loss(vgg, x, y):
  """pix2pixHD's VGGLoss: weighted L1 between the features, the target's held constant."""
  with torch.no_grad():
    fy = vgg(y)
  total = 0.0
  for w, a, b in zip(jax_vgg.LAYER_WEIGHTS, vgg(x), fy):
    total = total + w * (a.float() - b.float()).abs().mean()
  return total


def lsgan(predictions, target):
  """GANLoss(use_lsgan=True): MSE of each scale's patch scores to the target, summed."""
  return sum(((feats[-1].float() - target) ** 2).mean() for feats in predictions)


def feature_matching(fake, real, n_layers):
  """L1 between every intermediate discriminator feature, weighted as the reference."""
  weight = (4.0 / (n_layers + 1)) / len(fake)
  total = 0.0
  for fake_scale, real_scale in zip(fake, real):
    for a, b in zip(fake_scale[:-1], real_scale[:-1]):
      total = total + weight * (a.float() - b.detach().float()).abs().mean()
  return total


def instance_edges(instance_BxHxW):
  """pix2pixHD's get_edges: a pixel is an edge if a 4-neighbour has another instance id."""
  edge = torch.zeros_like(instance_BxHxW, dtype=torch.bool)
  dx = instance_BxHxW[:, :, 1:] != instance_BxHxW[:, :, :-1]
  dy = instance_BxHxW[:, 1:, :] != instance_BxHxW[:, :-1, :]
  edge[:, :, 1:] |= dx
  edge[:, :, :-1] |= dx
  edge[:, 1:, :] |= dy
  edge[:, :-1, :] |= dy
  return edge


def encode_input(cfg, batch):
  """(the generator's input, the discriminators' condition), NCHW float32: one-hot labels and
  the instance edges, and for the generator the instance features after them."""
  one_hot = F.one_hot(batch['label'].long(), cfg['label_nc']).permute(0, 3, 1, 2).float()
  edges = instance_edges(batch['instance'])[:, None].float()
  condition = torch.cat([one_hot, edges], dim=1)
  return torch.cat([condition, batch['feature']], dim=1), condition


def losses(cfg, generator, discriminator, vgg, batch):
  """{'g_loss', 'd_loss'}: detaches make the sum's gradient each network's own loss gradient
  (the discriminators see a detached fake; the generator's loss reaches the discriminators'
  input only, through detached copies of their weights)."""
  generator_input, condition = encode_input(cfg, batch)
  real = batch['image']
  fake = generator(generator_input)
  discriminate = lambda image: discriminator(torch.cat([condition, image], dim=1))
  pred_fake_detached = discriminate(fake.detach())
  pred_real = discriminate(real)
  d_loss = 0.5 * (lsgan(pred_fake_detached, 0.0) + lsgan(pred_real, 1.0))
  frozen = {k: v.detach() for k, v in discriminator.named_parameters()}
  pred_fake = torch.func.functional_call(
    discriminator, frozen, (torch.cat([condition, fake], dim=1),)
  )
  g_gan = lsgan(pred_fake, 1.0)
  g_feat = cfg['lambda_feat'] * feature_matching(pred_fake, pred_real, cfg['n_layers_D'])
  g_vgg = cfg['lambda_feat'] * perceptual_loss(vgg, fake, real)
  return {'g_loss': g_gan + g_feat + g_vgg, 'd_loss': d_loss}


def held_generator_parameters(cfg, generator: LocalEnhancer):
  """The generator's parameters its Adam holds: while the global generator is fixed
  (niter_fix_global), the local enhancer's alone, else all."""
  if jax_pix2pixhd.fixes_global(cfg):
    fixed = {id(p) for p in generator.global_trunk.parameters()}
    return [p for p in generator.parameters() if id(p) not in fixed]
  return list(generator.parameters())


def build_with_vgg(cfg: peer_lib.Config, device: torch.device):
  """(the Setup, the fixed VGG19 its loss reads)."""
  with torch.device(device):
    generator, discriminator = LocalEnhancer(cfg), MultiscaleDiscriminator(cfg)
    vgg = VGG19Features(cfg['vgg_base'])
  optimizer = torch.optim.Adam(
    [
      {'params': held_generator_parameters(cfg, generator)},
      {'params': list(discriminator.parameters())},
    ],
    lr=cfg['lr'],
    betas=(cfg['beta1'], 0.999),
  )

  def loss(batch, step):
    del step
    parts = losses(cfg, generator, discriminator, vgg, batch)
    return parts['g_loss'] + parts['d_loss']

  setup = peer_lib.Setup(
    modules={'generator': generator, 'discriminator': discriminator},
    updates=[peer_lib.Update(loss, optimizer)],
  )
  return setup, vgg


def build(cfg: peer_lib.Config, device: torch.device) -> peer_lib.Setup:
  return build_with_vgg(cfg, device)[0]


def make_batch(cfg, n, generator, device):
  """n street-like scenes as the JAX make_batch draws them: label maps (int32 class ids, a
  horizon between two stuff classes, then `shapes` rectangles and ellipses each its own
  instance, id class*1000 + k), instance ids, per-instance features in [-1, 1] (NCHW) and images
  in [-1, 1] (NCHW) coloured per class with shading and noise."""
  h, w, n_cls, n_shapes, n_feat = (
    cfg[k] for k in ('height', 'width', 'label_nc', 'shapes', 'feat_num')
  )
  u = torch.rand(n, 3 + 6 * n_shapes + n_feat * (n_shapes + 2), generator=generator, device=device)
  ys = ((torch.arange(h, device=device, dtype=torch.float32) + 0.5) / h)[None, :, None]
  xs = ((torch.arange(w, device=device, dtype=torch.float32) + 0.5) / w)[None, None, :]
  above = ys < (0.35 + 0.3 * u[:, 0])[:, None, None]  # n x H x 1
  top, bottom = (u[:, 1:3] * n_cls).int().unbind(1)
  label = torch.where(above, top[:, None, None], bottom[:, None, None]).expand(n, h, w)
  instance = label
  features = 2.0 * u[:, 3 + 6 * n_shapes :].reshape(n, n_shapes + 2, n_feat) - 1.0
  below = torch.where((top == bottom)[:, None], features[:, 0], features[:, 1])
  feature = torch.where(above[..., None], features[:, None, None, 0], below[:, None, None])
  feature = feature.expand(n, h, w, n_feat)
  per_shape = u[:, 3 : 3 + 6 * n_shapes].reshape(n, 6, n_shapes)
  radii = 0.02 + 0.18 * per_shape[:, 2:4]
  classes = (per_shape[:, 4] * n_cls).int()
  for k in range(n_shapes):
    dy = (ys - per_shape[:, 0, k, None, None]) / radii[:, 0, k, None, None]
    dx = (xs - per_shape[:, 1, k, None, None]) / radii[:, 1, k, None, None]
    inside = torch.where(
      (per_shape[:, 5, k] < 0.5)[:, None, None],
      dy**2 + dx**2 <= 1.0,
      (dy.abs() <= 1.0) & (dx.abs() <= 1.0),
    )
    label = torch.where(inside, classes[:, k, None, None], label)
    instance = torch.where(inside, classes[:, k, None, None] * 1000 + k + 1, instance)
    feature = torch.where(inside[..., None], features[:, None, None, k + 2], feature)
  palette = 0.8 * torch.sin(
    torch.arange(n_cls, device=device, dtype=torch.float32)[:, None]
    * torch.tensor([1.0, 2.39, 3.77], device=device)
    + 1.0
  )
  image = palette[label.long()] + 0.2 * (ys[..., None] - 0.5)
  image = image + 0.05 * torch.randn(n, h, w, 3, generator=generator, device=device)
  return {
    'label': label.contiguous(),
    'instance': instance.contiguous(),
    'feature': feature.permute(0, 3, 1, 2).contiguous(),
    'image': image.clamp(-1.0, 1.0).permute(0, 3, 1, 2).contiguous(),
  }


PIX2PIXHD = peer_lib.Peer(
  name='pix2pixhd',
  build=build,
  make_batch=make_batch,
  source='written from torch.nn layers (NVIDIA/pix2pixHD networks.py LocalEnhancer and '
  'MultiscaleDiscriminator, VGGLoss on a torchvision-layout VGG19 with random weights); '
  "pix2pixHD's ConvTranspose2d upsampling",
  differences=('features and images are NCHW (the JAX batch is NHWC)',),
)
