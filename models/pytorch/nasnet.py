"""The PyTorch peer of nasnet_large: timm's nasnetalarge (NASNet-A 6@4032, Cadene's port of slim's
model), trained as models/nasnet/ trains it.

At the config's layout (18 normal cells, two reductions) the network is timm's own
`create_model('nasnetalarge')` at the config's widths; another cell count (the tiny preset's 3)
keeps timm's stem and head and builds the normal and reduction cells from timm's cell classes,
wired as timm wires them. Drop-path, which timm's model lacks, is added as forward hooks on each
cell's operation branches with slim's (and the JAX workload's) schedule.
"""

import math

import timm
import torch
from timm.models import nasnet as timm_nasnet
from torch import nn
from torch.nn import functional as F

from models.nasnet import cells as jax_cells
from models.nasnet import nasnet as jax_nasnet
from models.pytorch import peer as peer_lib

FULL_CELLS, FULL_REDUCTIONS = 18, 2  # timm's fixed layout: three stacks of six normal cells


def layer_names(cfg) -> list[str]:
  """The cells after the two stem cells, in order, named as timm names them."""
  where = jax_nasnet.reduction_layers(cfg['num_cells'], cfg['num_reductions'])
  names = []
  for i in range(cfg['num_cells']):
    if i in where:
      names.append(f'reduction_cell_{where.index(i)}')
    names.append(f'cell_{i}')
  return names


def _build_cells(net: nn.Module, cfg) -> None:
  """Replace timm's 18 normal cells and two reductions by the config's, from timm's classes."""
  for name in layer_names(dict(cfg, num_cells=FULL_CELLS, num_reductions=FULL_REDUCTIONS)):
    delattr(net, name)
  c = cfg['filters']
  # Channels of the current input (x) and of the one before (x_prev): the outputs of the two
  # stem cells (four combinations each, of filters/4 and filters/2 channels).
  cx, cprev, width, first = 4 * (c // 2), 4 * (c // 4), c, True
  for name in layer_names(cfg):
    if name.startswith('reduction'):
      cell = timm_nasnet.ReductionCell0(
        in_chs_left=cprev,
        out_chs_left=2 * width,
        in_chs_right=cx,
        out_chs_right=2 * width,
        pad_type='same',
      )
      cx, width, first = 8 * width, 2 * width, True  # x_prev stays: the next cell reads it
    else:
      cls, left = (timm_nasnet.FirstCell, width // 2) if first else (timm_nasnet.NormalCell, width)
      cell = cls(
        in_chs_left=cprev,
        out_chs_left=left,
        in_chs_right=cx,
        out_chs_right=width,
        pad_type='same',
      )
      cprev, cx, first = cx, 6 * width, False
    setattr(net, name, cell)


class NASNet(nn.Module):
  """timm's NASNetALarge at the config's widths and layout, with drop-path in training."""

  def __init__(self, cfg):
    super().__init__()
    if cfg['filter_scaling'] != 2:
      # timm's stem cells take the second stem cell's width as twice the first's.
      raise ValueError(f'timm NASNet needs filter_scaling 2, got {cfg["filter_scaling"]}')
    self.net = timm.create_model(
      'nasnetalarge',
      pretrained=False,
      num_classes=cfg['num_classes'],
      stem_size=int(32 * cfg['stem_multiplier']),
      num_features=24 * cfg['filters'],  # timm's channels = num_features // 24 = filters
      drop_rate=cfg['dense_dropout'],
    )
    if (cfg['num_cells'], cfg['num_reductions']) != (FULL_CELLS, FULL_REDUCTIONS):
      _build_cells(self.net, cfg)
    self.names = layer_names(cfg)
    for m in self.net.modules():
      if isinstance(m, nn.BatchNorm2d):
        m.momentum = 1.0 - jax_cells.BN_MOMENTUM  # slim's decay 0.9997, in PyTorch's terms
    # Drop-path's progress in [0, 1]: the step over drop_path_steps (1 from the start if 0).
    self.register_buffer('progress', torch.zeros(()) if cfg['drop_path_steps'] else torch.ones(()))
    cells = ['cell_stem_0', 'cell_stem_1', *self.names]
    for index, name in enumerate(cells):
      # slim's layer ratio: deeper cells drop more, the last at 1 - drop_path_keep.
      keep = 1.0 - (index + 1) / len(cells) * (1.0 - cfg['drop_path_keep'])
      for branch_name, branch in getattr(self.net, name).named_children():
        if branch_name.startswith('comb_iter_') and keep < 1.0:
          branch.register_forward_hook(self._drop_path_hook(keep))

  def _drop_path_hook(self, keep_cell: float):
    """Zero a whole example's branch with probability 1 - keep, scaling survivors by 1/keep.
    The identity branches are no modules and are never dropped, as slim's."""

    def hook(module, inputs, x):
      del module, inputs
      if not self.training:
        return x
      keep = 1.0 - self.progress * (1.0 - keep_cell)
      noise = torch.rand(x.shape[0], 1, 1, 1, device=x.device)
      return x / keep.to(x.dtype) * torch.floor(keep + noise).to(x.dtype)

    return hook

  def forward(self, images_Bx3xHxW):
    net = self.net
    x_conv0 = net.conv0(images_Bx3xHxW)
    x_prev = net.cell_stem_0(x_conv0)
    x = net.cell_stem_1(x_conv0, x_prev)
    for name in self.names:
      if name.startswith('reduction'):
        x = getattr(net, name)(x, x_prev)  # the next cell reads the same x_prev
      else:
        x_prev, x = x, getattr(net, name)(x, x_prev)
    return net.forward_head(net.act(x))


def build(cfg: peer_lib.Config, device: torch.device) -> peer_lib.Setup:
  with torch.device(device):
    model = NASNet(cfg)
  model.train()
  # L2 on convolution and dense weights and the dense bias; batch-norm scales and offsets are
  # exempt, as the JAX workload's _decay_mask. SGD's weight_decay adds wd * w to the gradient
  # before the momentum, as optax.add_decayed_weights before optax.sgd.
  norms = {id(p) for m in model.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters()}
  decay = [p for p in model.parameters() if id(p) not in norms]
  no_decay = [p for p in model.parameters() if id(p) in norms]
  optimizer = torch.optim.SGD(
    [
      {'params': decay, 'weight_decay': cfg['weight_decay']},
      {'params': no_decay, 'weight_decay': 0.0},
    ],
    lr=cfg['lr'],
    momentum=0.9,
  )
  iteration = [0]

  def loss(batch, step):
    del step
    logits = model(batch['images'])
    return F.cross_entropy(
      logits.float(), batch['labels'].long(), label_smoothing=cfg['label_smoothing']
    )

  def after_step():
    iteration[0] += 1
    if cfg['drop_path_steps']:
      model.progress.fill_(min(1.0, iteration[0] / cfg['drop_path_steps']))

  return peer_lib.Setup(
    modules={'nasnet': model},
    updates=[peer_lib.Update(loss, optimizer)],
    after_step=after_step,
  )


def truncated_normal(shape, lo, hi, generator, device) -> torch.Tensor:
  """A standard normal truncated to [lo, hi], by the inverse CDF (as jax.random's)."""
  cdf = lambda x: 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
  u = torch.rand(shape, generator=generator, device=device)
  p = cdf(lo) + u * (cdf(hi) - cdf(lo))
  return (math.sqrt(2.0) * torch.erfinv(2.0 * p - 1.0)).clamp(lo, hi)


def make_batch(cfg, n, generator, device):
  """Images in [-1, 1] (0.5 x a normal truncated at 2), NCHW, and uniform int32 labels."""
  size = cfg['image_size']
  images = 0.5 * truncated_normal((n, 3, size, size), -2.0, 2.0, generator, device)
  labels = torch.randint(
    0, cfg['num_classes'], (n,), generator=generator, device=device, dtype=torch.int32
  )
  return {'images': images, 'labels': labels}


NASNET_LARGE = peer_lib.Peer(
  name='nasnet_large',
  build=build,
  make_batch=make_batch,
  source="timm's nasnetalarge (create_model at the config's widths; another cell count from "
  "timm's cell classes); drop-path added as forward hooks",
  differences=(
    'images are NCHW (the JAX batch is NHWC)',
    "timm's default initialization (the JAX workload's is slim's He fan-out)",
    "at a layout other than timm's 18 cells, a reduction cell whose second input already has "
    "its width keeps timm's 1x1 convolution there, which slim skips (the tiny preset: 288 "
    'parameters more)',
  ),
)
