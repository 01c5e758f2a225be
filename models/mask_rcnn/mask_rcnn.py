"""Mask R-CNN (He et al. 2017) with a ResNet-101-FPN body, as maskrcnn-benchmark's
e2e_mask_rcnn_R_101_FPN_1x, with every shape static so the whole step is one program.

Static-shape choices: ground truth padded to `max_instances`; top `pre_nms_top_n` proposals per
level, NMS per level as a padded fixed point, each image's top `post_nms_top_n`, of which the
batch's top `post_nms_top_n` stay valid (per batch, as the reference trains); the sampled RoIs
and anchors have fixed counts with a validity flag per slot; the mask head runs on the first
`mask_rois` sampled slots, where the positives are (the other slots weigh zero).
"""

import jax
import jax.numpy as jnp
import optax

from models import workload as wl
from models.mask_rcnn import data as mask_rcnn_data
from models.mask_rcnn import nets, resnet_fpn
from models.mask_rcnn.targets import loss


def _param_label(path, _):
  names = [getattr(p, 'key', str(p)) for p in path]
  if names[0] == 'backbone' and (
    names[1] in resnet_fpn.FROZEN_STAGES or names[1].split('_')[0] in resnet_fpn.FROZEN_STAGES
  ):
    return 'frozen'
  return 'bias' if names[-1] == 'bias' else 'weight'


def optimizer(cfg):
  """SGD momentum 0.9 with WarmupMultiStepLR; biases at 2x lr without decay; frozen stages fixed."""

  def schedule(step):
    alpha = jnp.minimum(step / max(cfg['warmup'], 1), 1.0)
    warm = cfg['warmup_factor'] * (1 - alpha) + alpha
    decays = sum((step >= s).astype(jnp.float32) for s in cfg['lr_steps'])
    return cfg['lr'] * warm * 0.1**decays

  momentum = cfg['momentum']
  return optax.multi_transform(
    {
      'weight': optax.chain(
        optax.add_decayed_weights(cfg['weight_decay']), optax.sgd(schedule, momentum)
      ),
      'bias': optax.sgd(lambda s: cfg['bias_lr_factor'] * schedule(s), momentum),
      'frozen': optax.set_to_zero(),
    },
    lambda params: jax.tree_util.tree_map_with_path(_param_label, params),
  )


def flops_per_example(cfg):
  """Training FLOPs of one image: 3x forward for trained layers, 1x for the frozen stem, res2.

  Convolutions and dense layers only; RoIAlign, NMS, IoU and the losses are negligible.
  """
  conv = lambda k, cin, cout, h, w: 2.0 * k * k * cin * cout * h * w
  half = lambda n: (n + 1) // 2
  h, w = half(cfg['image_size'][0]), half(cfg['image_size'][1])
  frozen = conv(7, 3, cfg['width'], h, w)
  h, w = half(h), half(w)
  trained, cin, sizes, channels = 0.0, cfg['width'], [], []
  for i, n in enumerate(cfg['blocks']):
    width, stage = cfg['width'] * 2**i, 0.0
    for j in range(n):
      if i > 0 and j == 0:
        h, w = half(h), half(w)
      stage += conv(1, cin, width, h, w) + conv(3, width, width, h, w)
      stage += conv(1, width, 4 * width, h, w) + (conv(1, cin, 4 * width, h, w) if j == 0 else 0)
      cin = 4 * width
    frozen, trained = (frozen + stage, trained) if i == 0 else (frozen, trained + stage)
    sizes.append((h, w))
    channels.append(cin)
  c = cfg['fpn_channels']
  sizes.append((half(sizes[-1][0]), half(sizes[-1][1])))  # P6
  for (h_l, w_l), cl in zip(sizes, channels):
    trained += conv(1, cl, c, h_l, w_l) + conv(3, c, c, h_l, w_l)
  a = len(cfg['anchor_ratios'])
  trained += sum(conv(3, c, c, hl, wl) + conv(1, c, 5 * a, hl, wl) for hl, wl in sizes)
  d, k = cfg['mlp_dim'], cfg['num_classes']
  trained += cfg['roi_batch'] * 2.0 * (c * cfg['box_pool'] ** 2 * d + d * d + d * 5 * k)
  p, mc = cfg['mask_pool'], cfg['mask_channels']
  per_mask = (
    conv(3, c, mc, p, p)
    + (cfg['mask_convs'] - 1) * conv(3, mc, mc, p, p)
    + conv(2, mc, mc, p, p)
    + conv(1, mc, k, 2 * p, 2 * p)
  )
  trained += cfg['mask_rois'] * per_mask
  return frozen + 3.0 * trained


MASK_RCNN_CONFIG = dict(
  # Data: a 4:3 COCO image resized to 800x1066 (short side 800), the batch padded to a size
  # divisible by 32 (SIZE_DIVISIBILITY) as the reference pads each batch to its largest image.
  # The worst case, an image at the 1333 long-side cap: image_size (800, 1344), content_size
  # (800, 1333).
  image_size=(800, 1088),
  content_size=(800, 1066),
  num_classes=81,
  max_instances=100,
  max_real_instances=15,
  box_size_range=(16.0, 640.0),
  gt_mask_size=56,
  # Body: ResNet-101 (blocks per stage), FPN.
  blocks=(3, 4, 23, 3),
  width=64,
  fpn_channels=256,
  # RPN on P2-P6: one anchor size per level, three aspect ratios.
  anchor_sizes=(32, 64, 128, 256, 512),
  anchor_ratios=(0.5, 1.0, 2.0),
  pre_nms_top_n=2000,
  # FPN_POST_NMS_TOP_N_TRAIN: proposals kept for the whole batch (FPN_POST_NMS_PER_BATCH), or
  # for each image with post_nms_per='image' (torchvision's and Detectron2's semantics).
  post_nms_top_n=2000,
  post_nms_per='batch',
  rpn_nms_threshold=0.7,
  rpn_batch=256,
  rpn_positive_fraction=0.5,
  rpn_fg_iou=0.7,
  rpn_bg_iou=0.3,
  # RoI heads.
  roi_batch=512,
  roi_positive_fraction=0.25,
  roi_fg_iou=0.5,
  canonical_scale=224,
  box_pool=7,
  mask_pool=14,
  # Mask head slots per image: the first `mask_rois` positives (the reference's mask head takes
  # every positive, at most roi_batch * roi_positive_fraction = 128). 32 holds the typical
  # image's positives (its ground truth, here 1 to 15 instances, plus the proposals that match
  # one); 128 is the worst case.
  mask_rois=32,
  sampling_ratio=2,
  mlp_dim=1024,
  mask_channels=256,
  mask_convs=4,
  # Images whose activations set the frozen batch norms' statistics at initialization.
  frozen_bn_images=8,
  # SOLVER of the 1x schedule (the 2020 runs set lr 0; we keep it real).
  lr=0.02,
  momentum=0.9,
  weight_decay=1e-4,
  bias_lr_factor=2.0,
  warmup=500,
  warmup_factor=1.0 / 3,
  lr_steps=(60000, 80000),
)
MASK_RCNN_TINY = dict(
  image_size=(64, 64),
  content_size=(64, 60),
  max_instances=6,
  max_real_instances=3,
  box_size_range=(10.0, 40.0),
  gt_mask_size=16,
  blocks=(1, 1, 1, 1),
  width=4,
  fpn_channels=16,
  anchor_sizes=(8, 16, 32, 64, 128),
  pre_nms_top_n=64,
  post_nms_top_n=32,
  rpn_batch=32,
  roi_batch=32,
  mask_rois=6,
  canonical_scale=32,
  mlp_dim=32,
  mask_channels=16,
  lr=0.005,
  warmup=1,
)


def check(cfg):
  """Stride-32 padding, instances and proposals in the numbers the static shapes assume."""
  (h, w), (ch, cw), (lo, hi) = cfg['image_size'], cfg['content_size'], cfg['box_size_range']
  candidates = cfg['post_nms_top_n'] + cfg['max_instances']
  positives = int(cfg['roi_batch'] * cfg['roi_positive_fraction'])
  return wl.first(
    (h % 32 or w % 32, f'image_size ({h}, {w}) must be multiples of 32'),
    (ch > h or cw > w, f'content_size ({ch}, {cw}) must fit in image_size ({h}, {w})'),
    (lo >= hi, f'box_size_range ({lo}, {hi}) must be (smallest, largest) box side'),
    (
      cfg['max_real_instances'] > cfg['max_instances'],
      'max_real_instances must be at most max_instances',
    ),
    (
      cfg['post_nms_top_n'] > len(cfg['anchor_sizes']) * cfg['pre_nms_top_n'],
      'post_nms_top_n must be at most pre_nms_top_n per level times the 5 levels',
    ),
    (
      cfg['roi_batch'] > candidates,
      f'roi_batch must be at most post_nms_top_n + max_instances ({candidates})',
    ),
    (
      cfg['mask_rois'] > int(cfg['roi_batch'] * cfg['roi_positive_fraction']),
      f'mask_rois must be at most roi_batch * roi_positive_fraction ({positives}), the most '
      'positives an image samples',
    ),
    (cfg['rpn_bg_iou'] > cfg['rpn_fg_iou'], 'rpn_bg_iou must be at most rpn_fg_iou'),
  )


MASK_RCNN = wl.Workload(
  name='mask_rcnn',
  description='Mask R-CNN R-101-FPN (maskrcnn-benchmark e2e_mask_rcnn_R_101_FPN_1x), 800x1088',
  unit='images',
  throughput_unit='images/s',
  config=MASK_RCNN_CONFIG,
  tiny=MASK_RCNN_TINY,
  spec=dict(
    num_classes=wl.Key(lo=2),  # the background and one class
    box_size_range=wl.Key(above=0),
    anchor_ratios=wl.Key(above=0, sized=False),
    rpn_nms_threshold=wl.PROBABILITY,
    rpn_positive_fraction=wl.PROBABILITY,
    rpn_fg_iou=wl.PROBABILITY,
    rpn_bg_iou=wl.PROBABILITY,
    post_nms_per=wl.Key(choices=('batch', 'image')),
    roi_positive_fraction=wl.PROBABILITY,
    roi_fg_iou=wl.PROBABILITY,
    momentum=wl.FRACTION,
    warmup=wl.NATURAL,
    warmup_factor=wl.Key(above=0, hi=1),
    lr_steps=wl.Key(lo=0, sized=False),
  ),
  check=check,
  trainer=wl.supervised(
    lambda cfg, dtype: nets.MaskRCNN(cfg, dtype), mask_rcnn_data.make_batch, loss, optimizer
  ),
  flops_per_example=flops_per_example,
  family='image',
  # 2: proposals kept per batch (2000) rather than per image (1000), a 800x1088 canvas rather
  # than 800x1344, and 32 mask RoIs per image rather than 128. 3: under bf16, RoIAlign's
  # gradient sums in float32.
  revision=3,
)
