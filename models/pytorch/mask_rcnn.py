"""The PyTorch peer of mask_rcnn: torchvision's MaskRCNN on a ResNet-101-FPN body with frozen batch
norm (resnet_fpn_backbone, maskrcnn-benchmark's trainable stages), at the config of
models/mask_rcnn/, with its own dynamic shapes.

The images, boxes, classes and masks are drawn as models/mask_rcnn/data.py draws them; the
targets go to torchvision as its list of dicts, with each instance's mask rasterized on the
whole image. As in the JAX workload, the frozen batch norms take their statistics from a sample
of such images at build time (random weights have no ImageNet statistics to load).
"""

import math

import torch
from torch import nn
from torchvision.models import resnet
from torchvision.models.detection import MaskRCNN, backbone_utils
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.rpn import RPNHead
from torchvision.ops import FrozenBatchNorm2d, MultiScaleRoIAlign
from torchvision.ops.feature_pyramid_network import LastLevelMaxPool

from models.mask_rcnn import data as jax_data
from models.pytorch import peer as peer_lib

R101_FPN = ((3, 4, 23, 3), 64, 256)  # blocks, res2 width, FPN channels of resnet_fpn_backbone
TRAINED_STAGES = ('layer2', 'layer3', 'layer4')  # trainable_layers=3: the stem and res2 frozen


class ResNet(resnet.ResNet):
  """torchvision's ResNet of Bottleneck blocks at any res2 width (torchvision's is 64): the
  tiny preset's body. Built by torchvision's _make_layer, initialized as torchvision's."""

  def __init__(self, blocks, width):
    nn.Module.__init__(self)
    self._norm_layer = FrozenBatchNorm2d
    self.inplanes, self.dilation, self.groups, self.base_width = width, 1, 1, 64
    self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
    self.bn1 = FrozenBatchNorm2d(width)
    self.relu = nn.ReLU(inplace=True)
    self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
    for i, n in enumerate(blocks):
      stage = self._make_layer(resnet.Bottleneck, width * 2**i, n, stride=1 if i == 0 else 2)
      setattr(self, f'layer{i + 1}', stage)
    for m in self.modules():
      if isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')


def backbone(cfg) -> backbone_utils.BackboneWithFPN:
  """resnet_fpn_backbone('resnet101') at R-101-FPN; the same construction at other sizes."""
  if (tuple(cfg['blocks']), cfg['width'], cfg['fpn_channels']) == R101_FPN:
    return backbone_utils.resnet_fpn_backbone(
      backbone_name='resnet101', weights=None, trainable_layers=3, norm_layer=FrozenBatchNorm2d
    )
  body = ResNet(cfg['blocks'], cfg['width'])
  for name, p in body.named_parameters():
    p.requires_grad_(name.startswith(TRAINED_STAGES))
  stages = len(cfg['blocks'])
  return backbone_utils.BackboneWithFPN(
    body,
    {f'layer{k + 1}': str(k) for k in range(stages)},
    [4 * cfg['width'] * 2**k for k in range(stages)],
    cfg['fpn_channels'],
    extra_blocks=LastLevelMaxPool(),
  )


@torch.no_grad()
def set_frozen_statistics(body: nn.Module, blocks, images_Bx3xHxW) -> None:
  """Each frozen batch norm normalizes its input on `images` to zero mean and unit deviation
  (the last of each residual branch to 1/sqrt(blocks in its stage)), in forward order, as
  models/mask_rcnn/resnet_fpn.FrozenBatchNorm sets itself at initialization."""
  gains = {}
  for i, n in enumerate(blocks):
    for block in getattr(body, f'layer{i + 1}'):
      gains[id(block.bn3)] = 1.0 / math.sqrt(n)

  def set_from(module, args):
    x = args[0].float()
    mean, var = x.mean(dim=(0, 2, 3)), x.var(dim=(0, 2, 3), unbiased=False)
    module.running_mean.copy_(mean)
    # A small map (a tiny preset's res5 is 2x2) gives noisy variances: floor them.
    module.running_var.copy_(torch.maximum(var, 0.1 * var.mean()))
    module.weight.fill_(gains.get(id(module), 1.0))
    module.bias.zero_()

  hooks = [
    m.register_forward_pre_hook(set_from)
    for m in body.modules()
    if isinstance(m, FrozenBatchNorm2d)
  ]
  body(images_Bx3xHxW)
  for hook in hooks:
    hook.remove()


def model(cfg) -> MaskRCNN:
  """torchvision's MaskRCNN with the config's anchors, samplers, poolers and heads."""
  c, k = cfg['fpn_channels'], cfg['num_classes']
  ratios = tuple(cfg['anchor_ratios'])
  levels = ['0', '1', '2', '3']  # RoIs pool from P2-P5; P6 serves the RPN only
  pool = lambda size: MultiScaleRoIAlign(
    levels, size, cfg['sampling_ratio'], canonical_scale=cfg['canonical_scale']
  )
  content = cfg['content_size']
  return MaskRCNN(
    backbone(cfg),
    # Scale min(min_size / short side, max_size / long side) = 1: no resize; images are padded
    # to a multiple of 32, the JAX canvas.
    min_size=min(content),
    max_size=max(content),
    # The images are already mean-subtracted BGR, as maskrcnn-benchmark's (no std).
    image_mean=[0.0, 0.0, 0.0],
    image_std=[1.0, 1.0, 1.0],
    rpn_anchor_generator=AnchorGenerator(
      tuple((s,) for s in cfg['anchor_sizes']), (ratios,) * len(cfg['anchor_sizes'])
    ),
    rpn_head=RPNHead(c, len(ratios)),
    rpn_pre_nms_top_n_train=cfg['pre_nms_top_n'],
    rpn_post_nms_top_n_train=cfg['post_nms_top_n'],
    rpn_nms_thresh=cfg['rpn_nms_threshold'],
    rpn_fg_iou_thresh=cfg['rpn_fg_iou'],
    rpn_bg_iou_thresh=cfg['rpn_bg_iou'],
    rpn_batch_size_per_image=cfg['rpn_batch'],
    rpn_positive_fraction=cfg['rpn_positive_fraction'],
    box_roi_pool=pool(cfg['box_pool']),
    box_head=TwoMLPHead(c * cfg['box_pool'] ** 2, cfg['mlp_dim']),
    box_predictor=FastRCNNPredictor(cfg['mlp_dim'], k),
    box_fg_iou_thresh=cfg['roi_fg_iou'],
    box_bg_iou_thresh=cfg['roi_fg_iou'],
    box_batch_size_per_image=cfg['roi_batch'],
    box_positive_fraction=cfg['roi_positive_fraction'],
    mask_roi_pool=pool(cfg['mask_pool']),
    mask_head=MaskRCNNHeads(c, [cfg['mask_channels']] * cfg['mask_convs'], 1),
    mask_predictor=MaskRCNNPredictor(cfg['mask_channels'], cfg['mask_channels'], k),
  )


def warmup_multistep(cfg):
  """maskrcnn-benchmark's WarmupMultiStepLR factor at 0-based step s, as the JAX optimizer's."""

  def factor(s: int) -> float:
    alpha = min(s / max(cfg['warmup'], 1), 1.0)
    warm = cfg['warmup_factor'] * (1 - alpha) + alpha
    return warm * 0.1 ** sum(s >= m for m in cfg['lr_steps'])

  return factor


def build(cfg: peer_lib.Config, device: torch.device) -> peer_lib.Setup:
  with torch.device(device):
    net = model(cfg)
  if torch.device(device).type != 'meta':
    generator = torch.Generator(device=device).manual_seed(0)
    sample = draw(cfg, cfg['frozen_bn_images'], generator, device)['images']
    set_frozen_statistics(net.backbone.body, cfg['blocks'], sample)
  net.train()
  trained = [(name, p) for name, p in net.named_parameters() if p.requires_grad]
  # SGD with momentum; weights decay, biases take twice the rate and no decay (maskrcnn-benchmark's
  # BIAS_LR_FACTOR 2, WEIGHT_DECAY_BIAS 0).
  optimizer = torch.optim.SGD(
    [
      {
        'params': [p for name, p in trained if not name.endswith('bias')],
        'weight_decay': cfg['weight_decay'],
      },
      {
        'params': [p for name, p in trained if name.endswith('bias')],
        'lr': cfg['bias_lr_factor'] * cfg['lr'],
        'weight_decay': 0.0,
      },
    ],
    lr=cfg['lr'],
    momentum=cfg['momentum'],
  )
  scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_multistep(cfg))
  height, width = cfg['content_size']

  def loss(batch, step):
    del step
    images = [image[:, :height, :width] for image in batch['images']]
    return sum(net(images, batch['targets']).values())

  return peer_lib.Setup(
    modules={'mask_rcnn': net},
    updates=[peer_lib.Update(loss, optimizer)],
    after_step=scheduler.step,
  )


def _inside(u, v, exponent):
  """Membership of box-normalized points in the inscribed superellipse, as data._inside."""
  inside_box = (u >= 0) & (u <= 1) & (v >= 0) & (v <= 1)
  return inside_box & ((2 * u - 1).abs() ** exponent + (2 * v - 1).abs() ** exponent <= 1)


def draw(cfg, n, generator, device) -> dict[str, torch.Tensor]:
  """n images with instances padded to max_instances, drawn as data.make_batch draws them:
  images [n, 3, H, W] (NCHW), gt_boxes [n, G, 4], gt_classes [n, G] int32, gt_masks
  [n, G, M, M] uint8 on a grid over each box, gt_valid [n, G], and gt_exponent [n, G] (each
  instance's superellipse exponent, from which the whole-image masks are rasterized)."""
  g = cfg['max_instances']
  height, width = cfg['content_size']
  u = torch.rand(n, g + 1, 9, generator=generator, device=device)
  count = 1 + torch.floor(u[:, g, 0] * cfg['max_real_instances']).int()
  valid = torch.arange(g, device=device) < count[:, None]
  u = u[:, :g]
  log_uniform = lambda x, lo, hi: torch.exp(math.log(lo) + x * (math.log(hi) - math.log(lo)))
  side = log_uniform(u[..., 0], *cfg['box_size_range'])
  ratio = log_uniform(u[..., 1], 0.5, 2.0)
  w = torch.clamp(side / ratio.sqrt(), max=width - 1.0)
  h = torch.clamp(side * ratio.sqrt(), max=height - 1.0)
  x1, y1 = u[..., 2] * (width - w), u[..., 3] * (height - h)
  boxes = torch.stack([x1, y1, x1 + w - 1, y1 + h - 1], dim=-1)  # x2 - x1 + 1 = w pixels
  boxes = torch.where(valid[..., None], boxes, 0.0)
  classes = 1 + torch.floor(u[..., 4] * (cfg['num_classes'] - 1)).int()
  classes = torch.where(valid, classes.clamp(max=cfg['num_classes'] - 1), 0).int()
  exponent = log_uniform(u[..., 5], 1.0, 8.0)
  colour = 255.0 * u[..., 6:9]

  # The image: a flat background of the mean colour with noise, the instances painted in order.
  canvas_h, canvas_w = cfg['image_size']
  ys = torch.arange(canvas_h, dtype=torch.float32, device=device)[:, None] + 0.5
  xs = torch.arange(canvas_w, dtype=torch.float32, device=device)[None, :] + 0.5
  noise = torch.rand(n, canvas_h, canvas_w, 3, generator=generator, device=device) * 2 - 1
  image = colour.mean(dim=1)[:, None, None, :] + 40.0 * noise
  for j in range(cfg['max_real_instances']):  # the valid instances are a prefix of at most this
    box = boxes[:, j, :, None, None]
    hit = _inside(
      (xs - box[:, 0]) / (box[:, 2] - box[:, 0] + 1),
      (ys - box[:, 1]) / (box[:, 3] - box[:, 1] + 1),
      exponent[:, j, None, None],
    )
    hit = hit & valid[:, j, None, None]
    image = torch.where(hit[..., None], colour[:, j, None, None, :], image)
  mean = torch.tensor(jax_data.PIXEL_MEAN, device=device)
  image = image.flip(-1) - mean  # RGB -> BGR255 minus the mean, as the reference
  content = (ys < height) & (xs < width)
  image = torch.where(content[..., None], image, 0.0)

  m = cfg['gt_mask_size']
  cells = (torch.arange(m, dtype=torch.float32, device=device) + 0.5) / m
  masks = _inside(cells[None, None, None, :], cells[None, None, :, None], exponent[..., None, None])
  return {
    'images': image.permute(0, 3, 1, 2).contiguous(),
    'gt_boxes': boxes,
    'gt_classes': classes,
    'gt_masks': (masks & valid[..., None, None]).to(torch.uint8),
    'gt_valid': valid,
    'gt_exponent': exponent,
  }


def targets(cfg, drawn) -> list[dict[str, torch.Tensor]]:
  """torchvision's targets of drawn images: each image's valid boxes, labels (int64) and masks
  [instances, content height, content width] (uint8), rasterized on the image's pixels."""
  height, width = cfg['content_size']
  device = drawn['gt_boxes'].device
  ys = torch.arange(height, dtype=torch.float32, device=device)[None, :, None] + 0.5
  xs = torch.arange(width, dtype=torch.float32, device=device)[None, None, :] + 0.5
  out = []
  for b, count in enumerate(drawn['gt_valid'].sum(dim=1).tolist()):
    boxes = drawn['gt_boxes'][b, :count]
    box = boxes[:, :, None, None]
    masks = _inside(
      (xs - box[:, 0]) / (box[:, 2] - box[:, 0] + 1),
      (ys - box[:, 1]) / (box[:, 3] - box[:, 1] + 1),
      drawn['gt_exponent'][b, :count, None, None],
    )
    out.append(
      {
        'boxes': boxes,
        'labels': drawn['gt_classes'][b, :count].long(),
        'masks': masks.to(torch.uint8),
      }
    )
  return out


def make_batch(cfg, n, generator, device):
  """The drawn batch (the JAX batch's arrays, images NCHW) and torchvision's `targets`."""
  drawn = draw(cfg, n, generator, device)
  return {**drawn, 'targets': targets(cfg, drawn)}


MASK_RCNN = peer_lib.Peer(
  name='mask_rcnn',
  build=build,
  make_batch=make_batch,
  source="torchvision's MaskRCNN on resnet_fpn_backbone('resnet101', FrozenBatchNorm2d, "
  'trainable_layers=3); the synthetic data and frozen statistics written to match the JAX '
  'workload',
  differences=(
    'images are NCHW (the JAX batch is NHWC)',
    "torchvision's Bottleneck strides in its 3x3 convolution (ResNet v1.5); maskrcnn-benchmark "
    'and the JAX workload stride in the 1x1 (STRIDE_IN_1X1): the same parameters, more FLOPs',
    'dynamic shapes: proposals, NMS, sampling and the mask head run on the counts each image has '
    '(the JAX workload pads them to static sizes)',
    "torchvision's RPN keeps anchors that cross the image border (maskrcnn-benchmark's "
    'straddle_thresh 0 drops them) and its box head regresses with smooth L1 beta 1/9 (beta 1 in '
    'maskrcnn-benchmark and JAX)',
    "torchvision's initialization of the box head",
    "torchvision's RPN keeps post_nms_top_n proposals per image; maskrcnn-benchmark and the JAX "
    "workload (post_nms_per='batch') keep that many for the whole batch",
    "torchvision's mask head trains on every sampled positive; the JAX workload's on the first "
    'mask_rois of each image',
  ),
  # --torch_compile: the ResNet-101-FPN backbone, whose shapes are the canvas's; the RPN and RoI
  # heads run eager (NMS and the sampled proposals give them data-dependent shapes).
  compiled=('mask_rcnn.backbone',),
)
