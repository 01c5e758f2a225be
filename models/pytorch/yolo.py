"""The PyTorch peer of yolov3: Darknet-53 and the three YOLOv3 heads in torch.nn.

darknet's yolov3.cfg at the config of models/yolo/yolo.py: convolution, batch norm and leaky
ReLU blocks, residual stages, nearest upsampling routes, the JAX workload's target assignment
(best anchor by shape, the later box winning a shared slot) and loss (darknet's deltas as BCE
and squared-error terms, the ignore threshold of models/yolo/targets.py), and SGD momentum with
weight decay on convolution kernels under darknet's burn-in and step schedule.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.pytorch import peer as peer_lib
from models.yolo import targets as jax_targets
from models.yolo import yolo as jax_yolo

ANCHOR_MASKS = jax_yolo.ANCHOR_MASKS


def _darknet_init(conv: nn.Conv2d) -> None:
  """darknet's init: uniform in +-sqrt(2 / fan_in); biases zero."""
  fan_in = conv.weight[0].numel()
  nn.init.uniform_(conv.weight, -math.sqrt(2.0 / fan_in), math.sqrt(2.0 / fan_in))
  if conv.bias is not None:
    nn.init.zeros_(conv.bias)


class ConvBNLeaky(nn.Sequential):
  """darknet's [convolutional] with batch_normalize=1: symmetric pad k//2, BN, leaky ReLU 0.1."""

  def __init__(self, cin: int, cout: int, kernel: int = 1, stride: int = 1):
    conv = nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, bias=False)
    _darknet_init(conv)
    # darknet's rolling statistics: 0.99 * old + 0.01 * batch.
    super().__init__(conv, nn.BatchNorm2d(cout, eps=1e-5, momentum=0.01), nn.LeakyReLU(0.1))


class Darknet53(nn.Module):
  """Stem, then stages of a strided 3x3 convolution and residual (1x1, 3x3) blocks; returns the
  outputs of the last three stages (strides 8, 16, 32)."""

  def __init__(self, width: int, blocks: tuple[int, ...]):
    super().__init__()
    self.stem = ConvBNLeaky(3, width, 3)
    self.downs, self.stages = nn.ModuleList(), nn.ModuleList()
    cin = width
    for i, count in enumerate(blocks):
      c = width * 2 ** (i + 1)
      self.downs.append(ConvBNLeaky(cin, c, 3, 2))
      self.stages.append(
        nn.ModuleList(
          nn.Sequential(ConvBNLeaky(c, c // 2, 1), ConvBNLeaky(c // 2, c, 3)) for _ in range(count)
        )
      )
      cin = c

  def forward(self, x):
    x, outs = self.stem(x), []
    for down, blocks in zip(self.downs, self.stages):
      x = down(x)
      for block in blocks:
        x = x + block(x)
      outs.append(x)
    return outs[-3:]


class YOLOv3(nn.Module):
  """Darknet-53 and the three heads with their upsampling routes.

  Returns raw outputs per scale, coarsest first, shaped (B, G, G, 3, 5 + classes) as the JAX
  workload's: tx, ty, tw, th, objectness, class logits.
  """

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    w, blocks = cfg['width'], tuple(cfg['blocks'])
    self.per_anchor = 5 + cfg['classes']
    self.darknet53 = Darknet53(w, blocks)
    chans = [w * 2 ** (i + 1) for i in range(len(blocks))]
    self.routes, self.heads, self.outs, self.detects = (nn.ModuleList() for _ in range(4))
    cin = chans[-1]
    for s in range(3):
      f = w * 16 // 2**s  # 512, 256, 128
      if s:
        self.routes.append(ConvBNLeaky(cin, f, 1))
        cin = f + chans[-1 - s]
      layers = []
      for i in range(5):
        cout, k = (f, 1) if i % 2 == 0 else (2 * f, 3)
        layers.append(ConvBNLeaky(cin, cout, k))
        cin = cout
      self.heads.append(nn.Sequential(*layers))
      self.outs.append(ConvBNLeaky(f, 2 * f, 3))
      detect = nn.Conv2d(2 * f, 3 * self.per_anchor, 1)
      _darknet_init(detect)
      self.detects.append(detect)

  def forward(self, images_Bx3xHxW):
    c3, c4, c5 = self.darknet53(images_Bx3xHxW)
    outputs, x = [], c5
    for s, lateral in enumerate([None, c4, c3]):
      if lateral is not None:
        x = F.interpolate(self.routes[s - 1](x), scale_factor=2, mode='nearest')
        x = torch.cat([x, lateral], dim=1)
      x = self.heads[s](x)
      y = self.detects[s](self.outs[s](x))
      b, _, g, _ = y.shape
      outputs.append(y.view(b, 3, self.per_anchor, g, g).permute(0, 3, 4, 1, 2))
    return outputs


def wh_iou(wh_Nx2, anchors_Ax2):
  """IoU of boxes and anchors with their centres aligned (darknet's best-anchor test)."""
  inter = torch.minimum(wh_Nx2[..., None, 0], anchors_Ax2[:, 0]) * torch.minimum(
    wh_Nx2[..., None, 1], anchors_Ax2[:, 1]
  )
  union = wh_Nx2[..., None, 0] * wh_Nx2[..., None, 1] + anchors_Ax2.prod(-1) - inter
  return inter / union.clamp(min=1e-12)


def box_iou(a, b):
  """IoU of (cx, cy, w, h) boxes, broadcasting over leading dimensions."""
  a_lo, a_hi = a[..., :2] - a[..., 2:] / 2, a[..., :2] + a[..., 2:] / 2
  b_lo, b_hi = b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2
  inter = (torch.minimum(a_hi, b_hi) - torch.maximum(a_lo, b_lo)).clamp(min=0.0).prod(-1)
  union = a[..., 2:].prod(-1) + b[..., 2:].prod(-1) - inter
  return inter / union.clamp(min=1e-12)


@torch.no_grad()
def build_targets(boxes_BxMx4, classes_BxM, valid_BxM, anchors_Ax2, grids, masks):
  """Dense targets per scale, as models/yolo/targets.build_targets: each valid box goes to the
  anchor with the best shape IoU, on the scale holding it, in the cell holding its centre; a
  slot two boxes share takes the later box. Per scale, over (B, G, G, anchors): 'obj', 'txy',
  'twh', 'weight' (2 - w*h) and 'cls'."""
  batch, max_boxes = classes_BxM.shape
  best = wh_iou(boxes_BxMx4[..., 2:], anchors_Ax2).argmax(-1)  # B x M
  box_ids = torch.arange(max_boxes, device=best.device).expand(batch, max_boxes)
  out = []
  for grid, mask in zip(grids, masks):
    mask = torch.as_tensor(mask, device=best.device)
    hit = best[..., None] == mask
    here = hit.any(-1) & valid_BxM
    slot = hit.int().argmax(-1)  # the anchor's index within this scale
    cell_xy = (boxes_BxMx4[..., :2] * grid).floor().clamp(0, grid - 1).long()
    flat = (cell_xy[..., 1] * grid + cell_xy[..., 0]) * len(mask) + slot
    size = grid * grid * len(mask)
    flat = torch.where(here, flat, size)  # boxes of other scales land in a spare slot
    winner = torch.full((batch, size + 1), -1, dtype=torch.long, device=best.device)
    winner = winner.scatter_reduce(1, flat, box_ids, 'amax')[:, :size]
    owner = winner.clamp(min=0)
    rows = torch.arange(batch, device=best.device)[:, None]
    pick = lambda x, owner=owner, rows=rows: x[rows, owner]  # the box each slot takes
    per_box_txy = boxes_BxMx4[..., :2] * grid - cell_xy
    safe_wh = torch.where(valid_BxM[..., None], boxes_BxMx4[..., 2:].clamp(min=1e-9), 1.0)
    per_box_twh = torch.log(safe_wh / anchors_Ax2[best])
    per_box_weight = 2.0 - boxes_BxMx4[..., 2] * boxes_BxMx4[..., 3]
    shape = (batch, grid, grid, len(mask))
    out.append(
      {
        'obj': (winner >= 0).float().view(shape),
        'txy': pick(per_box_txy).view(shape + (2,)),
        'twh': pick(per_box_twh).view(shape + (2,)),
        'weight': pick(per_box_weight).view(shape),
        'cls': pick(classes_BxM.long()).view(shape),
      }
    )
  return out


def decode_boxes(raw_BxGxGxAxK, anchors_Ax2):
  """Predicted (cx, cy, w, h) boxes of one scale, normalized to the image."""
  grid = raw_BxGxGxAxK.shape[1]
  col = torch.arange(grid, dtype=torch.float32, device=raw_BxGxGxAxK.device)
  offsets = torch.stack(torch.broadcast_tensors(col[None, :], col[:, None]), -1)[:, :, None]
  xy = (offsets + torch.sigmoid(raw_BxGxGxAxK[..., :2])) / grid
  wh = torch.exp(raw_BxGxGxAxK[..., 2:4]) * anchors_Ax2
  return torch.cat([xy, wh], -1)


@torch.no_grad()
def ignore_mask(raw_BxGxGxAxK, anchors_Ax2, boxes_BxMx4, valid_BxM, thresh):
  """1 where a prediction overlaps some valid truth by more than `thresh`."""
  pred = decode_boxes(raw_BxGxGxAxK, anchors_Ax2)
  pred_BxNx4 = pred.flatten(1, -2)
  iou_BxNxM = box_iou(pred_BxNx4[:, :, None], boxes_BxMx4[:, None])
  best = torch.where(valid_BxM[:, None], iou_BxNxM, 0.0).amax(-1)
  return (best > thresh).float().view(pred.shape[:-1])


def _bce(logits, targets):
  return F.binary_cross_entropy_with_logits(logits, targets, reduction='none')


def soft_bce(logits, targets):
  """BCE against soft targets minus the targets' entropy: 0 at the optimum, same gradient."""
  entropy = -(torch.special.xlogy(targets, targets) + torch.special.xlogy(1 - targets, 1 - targets))
  return _bce(logits, targets) - entropy


def yolo_loss(outputs, boxes_BxMx4, classes_BxM, valid_BxM, anchors_Ax2, masks, ignore_thresh):
  """models/yolo/targets.yolo_loss: the YOLOv3 loss summed over predictions and averaged over
  images; returns (loss, its terms)."""
  grids = [raw.shape[1] for raw in outputs]
  tgts = build_targets(boxes_BxMx4, classes_BxM, valid_BxM, anchors_Ax2, grids, masks)
  terms = dict.fromkeys(('xy', 'wh', 'obj', 'noobj', 'cls'), 0.0)
  for raw, tgt, mask in zip(outputs, tgts, masks):
    raw = raw.float()
    scale_anchors = anchors_Ax2[list(mask)]
    pos, weight = tgt['obj'], tgt['obj'] * tgt['weight']
    ignore = ignore_mask(raw, scale_anchors, boxes_BxMx4, valid_BxM, ignore_thresh)
    negative = (1.0 - pos) * (1.0 - ignore)
    obj = raw[..., 4]
    terms['xy'] += (weight[..., None] * soft_bce(raw[..., :2], tgt['txy'])).sum()
    terms['wh'] += (weight[..., None] * 0.5 * (raw[..., 2:4] - tgt['twh']).square()).sum()
    terms['obj'] += (pos * _bce(obj, torch.ones_like(obj))).sum()
    terms['noobj'] += (negative * _bce(obj, torch.zeros_like(obj))).sum()
    one_hot = F.one_hot(tgt['cls'], raw.shape[-1] - 5).float()
    terms['cls'] += (pos[..., None] * _bce(raw[..., 5:], one_hot)).sum()
  terms = {k: v / boxes_BxMx4.shape[0] for k, v in terms.items()}
  return sum(terms.values()), terms


def ignore_thresh(cfg: peer_lib.Config) -> float:
  """The JAX workload's ignore threshold: its config's where it has one, else targets.py's."""
  return cfg.get('ignore_thresh', jax_targets.IGNORE_THRESH)


def darknet_schedule(cfg: peer_lib.Config):
  """The learning-rate factor at 0-based step s, as models/yolo/yolo.darknet_schedule / lr:
  (s / burn_in)^4 during burn-in, then x0.1 at each of lr_steps."""
  burn_in, steps = cfg['burn_in'], tuple(cfg['lr_steps'])

  def factor(s: int) -> float:
    if s < burn_in:
      return (s / burn_in) ** 4
    return 0.1 ** sum(s >= step for step in steps)

  return factor


def build(cfg: peer_lib.Config, device: torch.device) -> peer_lib.Setup:
  with torch.device(device):
    model = YOLOv3(cfg)
    anchors_Ax2 = torch.tensor(cfg['anchors'], dtype=torch.float32) / cfg['image']
  model.train()
  # darknet decays convolution kernels only (not batch norm or biases), as the JAX mask does.
  kernels = [p for n, p in model.named_parameters() if p.dim() == 4]
  others = [p for n, p in model.named_parameters() if p.dim() != 4]
  optimizer = torch.optim.SGD(
    [
      {'params': kernels, 'weight_decay': cfg['weight_decay']},
      {'params': others, 'weight_decay': 0.0},
    ],
    lr=cfg['lr'],
    momentum=cfg['momentum'],
  )
  scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, darknet_schedule(cfg))
  thresh = ignore_thresh(cfg)

  def loss(batch, step):
    del step
    outputs = model(batch['images'])
    value, _ = yolo_loss(
      outputs, batch['boxes'], batch['classes'], batch['valid'], anchors_Ax2, ANCHOR_MASKS, thresh
    )
    return value

  return peer_lib.Setup(
    modules={'yolov3': model},
    updates=[peer_lib.Update(loss, optimizer)],
    after_step=scheduler.step,
  )


def make_batch(cfg, n, generator, device):
  """Uniform noise images (NCHW) and 1..max_boxes/2 boxes per image, as the JAX make_batch:
  sides log-uniform in [2%, 80%] of the image, each box inside it, padding rows zero."""
  m = cfg['max_boxes']
  rand = lambda *shape: torch.rand(shape, generator=generator, device=device)
  counts = torch.randint(1, m // 2 + 1, (n, 1), generator=generator, device=device)
  valid = torch.arange(m, device=device)[None] < counts
  lo, hi = math.log(0.02), math.log(0.8)
  wh = torch.exp(lo + (hi - lo) * rand(n, m, 2))
  xy = wh / 2 + rand(n, m, 2) * (1.0 - wh)
  boxes = torch.where(valid[..., None], torch.cat([xy, wh], -1), 0.0)
  classes = torch.randint(0, cfg['classes'], (n, m), generator=generator, device=device)
  classes = torch.where(valid, classes, 0).int()
  images = rand(n, 3, cfg['image'], cfg['image'])
  return {'images': images, 'boxes': boxes, 'classes': classes, 'valid': valid}


YOLOV3 = peer_lib.Peer(
  name='yolov3',
  build=build,
  make_batch=make_batch,
  source='written from torch.nn layers (darknet yolov3.cfg: Darknet-53, three YOLO heads); '
  "the JAX workload's target assignment and loss in torch",
  differences=('images are NCHW (the JAX batch is NHWC)',),
)
