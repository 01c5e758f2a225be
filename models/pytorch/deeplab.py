"""The PyTorch peer of deeplabv3: DeepLabv3+ on timm's aligned Xception-65, in torch.nn.

timm's XceptionAligned with xception65's block list (at the config's widths) is the backbone, at
the config's output stride through timm's own `output_stride` (the blocks past it run at stride
1 with dilation 2). The decoder's low-level features are entry_flow block 2's second separable
convolution before the ReLU that follows it, as DeepLab's end point. ASPP (1x1, three atrous
separable 3x3 at rates 6/12/18, image pooling), the decoder at output stride 4, logits upsampled
to the crop, cross-entropy without the 255 label and momentum SGD with the poly schedule and L2
on non-depthwise kernels, at the config of models/deeplab/deeplab.py.
"""

import functools

import torch
from timm.layers import ConvNormAct
from timm.models.xception_aligned import XceptionAligned
from torch import nn
from torch.nn import functional as F

from models.deeplab import deeplab as jax_deeplab
from models.deeplab import xception as jax_xception
from models.pytorch import peer as peer_lib

IGNORE_LABEL = jax_deeplab.IGNORE_LABEL
BN_MOMENTUM = 1.0 - jax_xception.BN_DECAY  # torch's momentum weighs the batch


def _trunc_normal(weight: torch.Tensor, std: float) -> None:
  """A normal truncated at two standard deviations, as flax's truncated_normal(std)."""
  nn.init.trunc_normal_(weight, std=std, a=-2.0 * std, b=2.0 * std)


def backbone(cfg: peer_lib.Config) -> XceptionAligned:
  """timm's aligned Xception-65 at the config's widths and output stride, without its classifier.

  At the full config this is timm's xception65 (whose stem is 32, 64 wide); at another stem
  width the stem is timm's two ConvNormActs at that width. Batch norm as DeepLab's backbone
  (epsilon 1e-3, decay 0.9997) and every convolution truncated-normal 0.09 (xception_arg_scope).
  """
  norm = functools.partial(nn.BatchNorm2d, eps=jax_xception.BACKBONE_BN_EPS, momentum=BN_MOMENTUM)
  stem1, stem2 = cfg['stem']
  x1, x2 = cfg['exit_depths']
  block_cfg = [
    dict(in_chs=cin, out_chs=tuple(depths), stride=2)
    for cin, depths in zip((stem2, *(d[-1] for d in cfg['entry_depths'][:-1])), cfg['entry_depths'])
  ]
  entry_out, mid = cfg['entry_depths'][-1][-1], cfg['middle_depth']
  block_cfg += [
    dict(in_chs=entry_out if i == 0 else mid, out_chs=(mid,) * 3, stride=1)
    for i in range(cfg['middle_blocks'])
  ]
  block_cfg += [
    dict(in_chs=mid, out_chs=tuple(x1), stride=2),
    dict(in_chs=x1[-1], out_chs=tuple(x2), stride=1, no_skip=True, start_with_relu=False),
  ]
  net = XceptionAligned(
    block_cfg,
    num_classes=0,
    output_stride=cfg['output_stride'],
    norm_layer=norm,
    global_pool='',
  )
  if (stem1, stem2) != (32, 64):
    net.stem = nn.Sequential(
      ConvNormAct(3, stem1, kernel_size=3, stride=2, norm_layer=norm),
      ConvNormAct(stem1, stem2, kernel_size=3, stride=1, norm_layer=norm),
    )
  for m in net.modules():
    if isinstance(m, nn.Conv2d):
      _trunc_normal(m.weight, 0.09)
  return net


def _bn(channels: int) -> nn.BatchNorm2d:
  return nn.BatchNorm2d(channels, eps=jax_deeplab.HEAD_BN_EPS, momentum=BN_MOMENTUM)


class HeadConv(nn.Sequential):
  """A 1x1 convolution (Glorot uniform), batch norm and ReLU of the ASPP and decoder."""

  def __init__(self, cin: int, cout: int):
    conv = nn.Conv2d(cin, cout, 1, bias=False)
    nn.init.xavier_uniform_(conv.weight)
    super().__init__(conv, _bn(cout), nn.ReLU())


class HeadSeparable(nn.Sequential):
  """DeepLab's split separable convolution: depthwise 3x3 at `rate`, BN, ReLU, then pointwise
  1x1, BN, ReLU (truncated-normal 0.33 and 0.06, as model.py)."""

  def __init__(self, cin: int, cout: int, rate: int):
    depthwise = nn.Conv2d(cin, cin, 3, padding=rate, dilation=rate, groups=cin, bias=False)
    pointwise = nn.Conv2d(cin, cout, 1, bias=False)
    _trunc_normal(depthwise.weight, 0.33)
    _trunc_normal(pointwise.weight, 0.06)
    super().__init__(depthwise, _bn(cin), nn.ReLU(), pointwise, _bn(cout), nn.ReLU())


class DeepLabV3Plus(nn.Module):
  """Xception-65, ASPP, decoder and logits; returns logits [B, classes, crop, crop]."""

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    self.cfg = cfg
    self.xception_65 = backbone(cfg)
    features = cfg['exit_depths'][-1][-1]
    low_level = cfg['entry_depths'][1][1]
    depth, dd = cfg['aspp_depth'], cfg['decoder_depth']
    self.image_pooling = HeadConv(features, depth)
    self.aspp0 = HeadConv(features, depth)
    self.aspp = nn.ModuleList(HeadSeparable(features, depth, r) for r in cfg['atrous_rates'])
    self.concat_projection = HeadConv((len(cfg['atrous_rates']) + 2) * depth, depth)
    self.drop = nn.Dropout(cfg['aspp_dropout'])
    self.feature_projection0 = HeadConv(low_level, cfg['projection_depth'])
    self.decoder = nn.Sequential(
      HeadSeparable(depth + cfg['projection_depth'], dd, 1), HeadSeparable(dd, dd, 1)
    )
    self.logits = nn.Conv2d(dd, cfg['classes'], 1)
    _trunc_normal(self.logits.weight, 0.01)
    nn.init.zeros_(self.logits.bias)

  def features(self, images_Bx3xHxW):
    """The backbone's output and its low-level features (entry_flow block 2's second separable
    convolution, before the ReLU that opens the third)."""
    net = self.xception_65
    x = net.stem(images_Bx3xHxW)
    low_level = None
    for i, block in enumerate(net.blocks):
      if i != 1:
        x = block(x)
        continue
      stack = block.stack
      low_level = stack.conv2(stack.act2(stack.conv1(stack.act1(x))))
      # Not stack.act3, which works in place and would overwrite the low-level features.
      x = stack.conv3(F.relu(low_level)) + block.shortcut(x)
    return x, low_level

  def forward(self, images_Bx3xHxW):
    cfg = self.cfg
    features, low_level = self.features(images_Bx3xHxW)
    pooled = self.image_pooling(features.mean(dim=(2, 3), keepdim=True))
    branches = [pooled.expand(-1, -1, *features.shape[2:]), self.aspp0(features)]
    branches += [branch(features) for branch in self.aspp]
    x = self.drop(self.concat_projection(torch.cat(branches, dim=1)))
    crop = cfg['crop']
    dec = jax_deeplab.scale_dimension(crop, 1.0 / cfg['decoder_output_stride'])
    resize = lambda t, size: (
      t
      if t.shape[-1] == size and t.shape[-2] == size
      else F.interpolate(t, size=(size, size), mode='bilinear', align_corners=True)
    )
    low = self.feature_projection0(low_level)
    x = self.decoder(torch.cat([resize(x, dec), resize(low, dec)], dim=1))
    return resize(self.logits(x), crop)


def cross_entropy(logits_BxKxHxW, labels_BxHxW):
  """Mean per-pixel softmax cross-entropy over the pixels not labelled 255."""
  labels = labels_BxHxW.long()
  per_pixel = F.cross_entropy(
    logits_BxKxHxW.float(), labels, ignore_index=IGNORE_LABEL, reduction='none'
  )
  valid = (labels != IGNORE_LABEL).float()
  return (per_pixel * valid).sum() / valid.sum().clamp(min=1.0)


def poly(cfg: peer_lib.Config):
  """The learning-rate factor at 0-based step s, as optax.polynomial_schedule to 0."""
  total, power = cfg['total_steps'], cfg['lr_power']
  return lambda s: (1.0 - min(s, total) / total) ** power


def build(cfg: peer_lib.Config, device: torch.device) -> peer_lib.Setup:
  with torch.device(device):
    model = DeepLabV3Plus(cfg)
  model.train()
  # L2 on convolution kernels only: not depthwise kernels, biases or batch norm (the JAX mask).
  convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
  decay = {id(m.weight) for m in convs if m.groups == 1}
  params = list(model.parameters())
  optimizer = torch.optim.SGD(
    [
      {'params': [p for p in params if id(p) in decay], 'weight_decay': cfg['weight_decay']},
      {'params': [p for p in params if id(p) not in decay], 'weight_decay': 0.0},
    ],
    lr=cfg['lr'],
    momentum=cfg['momentum'],
  )
  scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, poly(cfg))

  def loss(batch, step):
    del step
    return cross_entropy(model(batch['images']), batch['labels'])

  return peer_lib.Setup(
    modules={'deeplabv3': model},
    updates=[peer_lib.Update(loss, optimizer)],
    after_step=scheduler.step,
  )


def make_batch(cfg, n, generator, device):
  """Images (NCHW) whose colour follows a blocky class map, and int32 labels with 255 in a band
  along region borders, drawn as the JAX make_batch draws them."""
  crop, grid, classes = cfg['crop'], cfg['label_grid'], cfg['classes']
  coarse = torch.randint(
    0, classes, (n, grid, grid), generator=generator, device=device, dtype=torch.int32
  )
  pixels = torch.arange(crop, device=device)
  cell = pixels * grid // crop
  before = (pixels - cfg['ignore_band']).clamp(min=0) * grid // crop  # no wrap-around
  labels = coarse[:, cell][:, :, cell]
  border = (labels != coarse[:, before][:, :, cell]) | (labels != coarse[:, cell][:, :, before])
  labels = torch.where(border, IGNORE_LABEL, labels).int()
  palette = 2.0 * torch.rand((classes + 1, 3), generator=generator, device=device) - 1.0
  noise = 0.3 * torch.randn((n, 3, crop, crop), generator=generator, device=device)
  colours = palette[labels.clamp(max=classes).long()].permute(0, 3, 1, 2)
  images = (colours + noise).clamp(-1.0, 1.0)  # DeepLab feeds images scaled to [-1, 1]
  return {'images': images, 'labels': labels}


DEEPLABV3 = peer_lib.Peer(
  name='deeplabv3',
  build=build,
  make_batch=make_batch,
  source="timm's XceptionAligned (xception65's blocks, output_stride from the config); ASPP, "
  'decoder and logits written from torch.nn layers',
  differences=('images are NCHW (the JAX batch is NHWC)',),
)
