"""The Mask R-CNN network: the ResNet-FPN body, RPN, box and mask heads, one training forward."""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.layers import rbg_init
from models.mask_rcnn import data as mask_rcnn_data
from models.mask_rcnn import detection_ops as ops
from models.mask_rcnn import resnet_fpn
from models.mask_rcnn.targets import keep_proposals, propose, roi_targets, rpn_targets

normal = lambda std: rbg_init.rbg(nn.initializers.normal(std))
fc_init = rbg_init.rbg(nn.initializers.variance_scaling(1.0, 'fan_in', 'uniform'))  # a=1
mask_init = rbg_init.rbg(nn.initializers.variance_scaling(2.0, 'fan_out', 'normal'))


def strides(cfg):
  return tuple(2 ** (i + 2) for i in range(len(cfg['anchor_sizes'])))  # P2..P6: 4..64


class RPNHead(nn.Module):
  """Shared 3x3 conv, then per-anchor objectness and box deltas on every level."""

  anchors: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, features):
    c = features[0].shape[-1]
    conv = nn.Conv(c, (3, 3), padding=1, kernel_init=normal(0.01), dtype=self.dtype, name='conv')
    cls = nn.Conv(
      self.anchors, (1, 1), kernel_init=normal(0.01), dtype=self.dtype, name='cls_logits'
    )
    box = nn.Conv(
      4 * self.anchors, (1, 1), kernel_init=normal(0.01), dtype=self.dtype, name='bbox_pred'
    )
    outputs = []
    for f in features:
      t = nn.relu(conv(f))
      b = f.shape[0]
      outputs.append((cls(t).reshape(b, -1), box(t).reshape(b, -1, 4)))
    return outputs


class BoxHead(nn.Module):
  """FPN2MLPFeatureExtractor (fc6, fc7) and FPNPredictor (class logits, per-class deltas)."""

  mlp_dim: int
  num_classes: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, pooled_BxRxPxPxC):
    dense = functools.partial(nn.Dense, dtype=self.dtype)
    x = pooled_BxRxPxPxC.reshape(*pooled_BxRxPxPxC.shape[:2], -1)
    x = nn.relu(dense(self.mlp_dim, kernel_init=fc_init, name='fc6')(x))
    x = nn.relu(dense(self.mlp_dim, kernel_init=fc_init, name='fc7')(x))
    logits = dense(self.num_classes, kernel_init=normal(0.01), name='cls_score')(x)
    deltas = dense(4 * self.num_classes, kernel_init=normal(0.001), name='bbox_pred')(x)
    return logits, deltas.reshape(*deltas.shape[:2], self.num_classes, 4)


class MaskHead(nn.Module):
  """MaskRCNNFPNFeatureExtractor (3x3 convs) and MaskRCNNC4Predictor (2x deconv, 1x1 logits)."""

  channels: int
  convs: int
  num_classes: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_NxPxPxC):
    x = x_NxPxPxC
    for i in range(self.convs):
      x = nn.relu(
        nn.Conv(
          self.channels,
          (3, 3),
          padding=1,
          kernel_init=mask_init,
          dtype=self.dtype,
          name=f'mask_fcn{i + 1}',
        )(x)
      )
    x = nn.relu(
      nn.ConvTranspose(
        self.channels,
        (2, 2),
        (2, 2),
        padding='VALID',
        kernel_init=mask_init,
        dtype=self.dtype,
        name='conv5_mask',
      )(x)
    )
    return nn.Conv(
      self.num_classes, (1, 1), kernel_init=mask_init, dtype=self.dtype, name='mask_fcn_logits'
    )(x)


class MaskRCNN(nn.Module):
  """Mask R-CNN training forward: returns the sampled predictions and their targets."""

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch, train):
    del train  # frozen batch norm and no dropout: training and evaluation compute alike
    cfg = self.cfg
    if self.is_initializing():
      # The frozen batch norms take their statistics from the images `init` runs on. One
      # image (the harness's init batch) misjudges the others' contrast (image RMS 29 to 64
      # with 1 to 15 instances), which compounds through 33 blocks: 3-5x too large FPN
      # features on the training batch. A sample of images sets population statistics.
      batch = mask_rcnn_data.make_batch(cfg, self.make_rng('dropout'), cfg['frozen_bn_images'])
    features = resnet_fpn.ResNetFPN(
      tuple(cfg['blocks']), cfg['width'], cfg['fpn_channels'], self.dtype, name='backbone'
    )(batch['images'].astype(self.dtype))
    ratios = tuple(cfg['anchor_ratios'])
    levels = RPNHead(len(ratios), self.dtype, name='rpn')(features)
    anchors = [
      ops.grid_anchors(s, size, ratios, f.shape[1], f.shape[2])
      for s, size, f in zip(strides(cfg), cfg['anchor_sizes'], features)
    ]
    b, num_anchors = features[0].shape[0], sum(a.shape[0] for a in anchors)
    gt_boxes, gt_valid = batch['gt_boxes'], batch['gt_valid']
    # The samplers' randomness: one draw (each jax.random call compiles its own hash).
    priority = jax.random.uniform(
      rbg_init.rbg_key(self.make_rng('dropout')),
      (b, num_anchors + cfg['post_nms_top_n'] + gt_valid.shape[1]),
    )

    rpn_idx, rpn_pos, rpn_valid, rpn_box_targets = jax.vmap(
      functools.partial(rpn_targets, cfg, jnp.concatenate(anchors))
    )(priority[:, :num_anchors], gt_boxes, gt_valid)
    logits_BxN = jnp.concatenate([logits for logits, _ in levels], axis=1)
    deltas_BxNx4 = jnp.concatenate([d for _, d in levels], axis=1)

    # Proposals carry no gradient, as in the reference (they are detached).
    per_image = jax.tree.map(jax.lax.stop_gradient, levels)
    if self.is_initializing():
      # The heads' shapes do not depend on which RoIs: skip NMS and sampling in `init`.
      proposals = jnp.zeros((b, cfg['post_nms_top_n'], 4), jnp.float32)
      proposals_valid = jnp.ones((b, cfg['post_nms_top_n']), bool)
    else:
      proposals, scores = jax.vmap(lambda o: propose(cfg, o, anchors))(per_image)
      proposals_valid = keep_proposals(cfg, scores)
    t = jax.vmap(functools.partial(roi_targets, cfg))(
      priority[:, num_anchors:],
      proposals,
      proposals_valid,
      gt_boxes,
      batch['gt_classes'],
      batch['gt_masks'],
      gt_valid,
    )

    pooled_levels = features[:-1]  # RoIs pool from P2-P5; P6 serves the RPN only
    pool = functools.partial(
      ops.multilevel_roi_align, strides=strides(cfg)[:-1], sampling_ratio=cfg['sampling_ratio']
    )
    level = functools.partial(
      ops.roi_levels, num_levels=len(pooled_levels), canonical_scale=cfg['canonical_scale']
    )
    rois = t['rois']
    box_features = jax.vmap(lambda f, r: pool(f, r, level(r), output_size=cfg['box_pool']))(
      pooled_levels, rois
    )
    cls_logits, box_deltas = BoxHead(
      cfg['mlp_dim'], cfg['num_classes'], self.dtype, name='box_head'
    )(box_features)
    box_deltas = jnp.take_along_axis(box_deltas, t['classes'][..., None, None], axis=2)[:, :, 0]

    m = t['mask_targets'].shape[1]
    mask_features = jax.vmap(lambda f, r: pool(f, r, level(r), output_size=cfg['mask_pool']))(
      pooled_levels, rois[:, :m]
    )
    mask_logits = MaskHead(
      cfg['mask_channels'], cfg['mask_convs'], cfg['num_classes'], self.dtype, name='mask_head'
    )(mask_features.reshape(b * m, *mask_features.shape[2:]))
    mask_logits = mask_logits.reshape(b, m, *mask_logits.shape[1:])
    mask_logits = jnp.take_along_axis(mask_logits, t['classes'][:, :m, None, None, None], axis=-1)[
      ..., 0
    ]
    return {
      'rpn_logits': jnp.take_along_axis(logits_BxN, rpn_idx, axis=1),
      'rpn_deltas': jnp.take_along_axis(deltas_BxNx4, rpn_idx[..., None], axis=1),
      'rpn_positive': rpn_pos,
      'rpn_valid': rpn_valid,
      'rpn_box_targets': rpn_box_targets,
      'cls_logits': cls_logits,
      'box_deltas': box_deltas,
      'mask_logits': mask_logits,
      **t,
    }
