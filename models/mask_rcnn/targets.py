"""Mask R-CNN (He et al. 2017) anchor and RoI target assignment, proposals, and the five losses."""

import jax
import jax.numpy as jnp
import optax

from models.mask_rcnn import detection_ops as ops

RPN_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
ROI_WEIGHTS = (10.0, 10.0, 5.0, 5.0)  # MODEL.ROI_HEADS.BBOX_REG_WEIGHTS


def rpn_targets(cfg, anchors_Nx4, priority_N, gt_boxes, gt_valid):
  """Sampled anchors of one image: (indices, positive, valid, box targets)."""
  h, w = cfg['content_size']
  # straddle_thresh 0: anchors leaving the (unpadded) image are ignored.
  visible = (
    (anchors_Nx4[:, 0] >= 0)
    & (anchors_Nx4[:, 1] >= 0)
    & (anchors_Nx4[:, 2] < w)
    & (anchors_Nx4[:, 3] < h)
  )
  index, label = ops.match(
    ops.pairwise_iou(anchors_Nx4, gt_boxes),
    gt_valid,
    cfg['rpn_fg_iou'],
    cfg['rpn_bg_iou'],
    low_quality=True,
  )
  idx, positive, valid = ops.sample(
    priority_N,
    visible & (label == 1),
    visible & (label == 0),
    cfg['rpn_batch'],
    cfg['rpn_positive_fraction'],
  )
  targets = jnp.where(
    positive[:, None], ops.encode(gt_boxes[index[idx]], anchors_Nx4[idx], RPN_WEIGHTS), 0.0
  )
  return idx, positive, valid, targets


def propose(cfg, level_outputs, anchors):
  """Proposals of one image: top-k per level, decode, clip, NMS per level, then the top
  `post_nms_top_n` of the image's survivors with their objectness logits (-inf where none)."""
  k = cfg['pre_nms_top_n']
  h, w = cfg['content_size']
  boxes, scores, valid = [], [], []
  for (logits_N, deltas_Nx4), anchors_Nx4 in zip(level_outputs, anchors):
    k_l = min(k, logits_N.shape[0])
    top, idx = jax.lax.top_k(logits_N.astype(jnp.float32), k_l)
    b = ops.clip_boxes(
      ops.decode(deltas_Nx4[idx].astype(jnp.float32), anchors_Nx4[idx], RPN_WEIGHTS), h, w
    )
    pad = k - k_l  # levels with fewer anchors than k (P6) are padded to stack
    boxes.append(jnp.pad(b, ((0, pad), (0, 0))))
    scores.append(jnp.pad(top, (0, pad), constant_values=-jnp.inf))
    valid.append(jnp.arange(k) < k_l)
  boxes, scores, valid = jnp.stack(boxes), jnp.stack(scores), jnp.stack(valid)
  keep_LxK = jax.vmap(ops.nms, in_axes=(0, 0, None))(boxes, valid, cfg['rpn_nms_threshold'])
  top, idx = jax.lax.top_k(jnp.where(keep_LxK, scores, -jnp.inf).reshape(-1), cfg['post_nms_top_n'])
  return boxes.reshape(-1, 4)[idx], top


def keep_proposals(cfg, scores_BxN):
  """Which proposals go on to the RoI heads: FPN_POST_NMS_TOP_N_TRAIN over the whole batch's
  proposals (maskrcnn-benchmark's FPN_POST_NMS_PER_BATCH, its default), or per image.

  Each image offers its own top `post_nms_top_n` (no image can hold more of the batch's top
  `post_nms_top_n`), so the batch's top of these is the reference's selection, ties aside.
  """
  n = cfg['post_nms_top_n']
  alive = scores_BxN > -jnp.inf
  if cfg['post_nms_per'] == 'image':
    return alive
  flat = scores_BxN.reshape(-1)
  chosen = jnp.zeros(flat.shape, bool).at[jax.lax.top_k(flat, n)[1]].set(True)
  return chosen.reshape(scores_BxN.shape) & alive


def roi_targets(
  cfg, priority_R, proposals, proposals_valid, gt_boxes, gt_classes, gt_masks, gt_valid
):
  """Sampled RoIs of one image, ground truth added to the proposals, with their targets."""
  rois = jnp.concatenate([proposals, gt_boxes])
  valid = jnp.concatenate([proposals_valid, gt_valid])
  index, label = ops.match(
    ops.pairwise_iou(rois, gt_boxes),
    gt_valid,
    cfg['roi_fg_iou'],
    cfg['roi_fg_iou'],
    low_quality=False,
  )
  idx, positive, ok = ops.sample(
    priority_R,
    valid & (label == 1),
    valid & (label == 0),
    cfg['roi_batch'],
    cfg['roi_positive_fraction'],
  )
  rois, gt = rois[idx], index[idx]
  classes = jnp.where(positive, gt_classes[gt], 0)
  # Only positives regress; zeroing the rest keeps 0 * inf out of the masked loss.
  box_targets = jnp.where(positive[:, None], ops.encode(gt_boxes[gt], rois, ROI_WEIGHTS), 0.0)
  # Positives fill the first slots, so the mask RoIs are a fixed prefix of the sample: the
  # first `mask_rois` positives (the reference's mask head takes every positive).
  m = cfg['mask_rois']
  mask_targets = jax.vmap(ops.project_masks, in_axes=(0, 0, 0, None))(
    gt_masks[gt[:m]], gt_boxes[gt[:m]], rois[:m], 2 * cfg['mask_pool']
  )
  return {
    'rois': rois,
    'roi_gt': gt,
    'classes': classes,
    'roi_valid': ok,
    'roi_positive': positive,
    'box_targets': box_targets,
    'mask_targets': mask_targets,
  }


def smooth_l1(x, beta):
  ax = jnp.abs(x)
  return jnp.where(ax < beta, 0.5 * x * x / beta, ax - 0.5 * beta)


def loss(cfg, out, batch):
  """maskrcnn-benchmark's five losses, each normalized as the reference does."""
  del cfg, batch
  f32 = lambda x: x.astype(jnp.float32)
  rpn_w, rpn_pos = f32(out['rpn_valid']), f32(out['rpn_positive'])
  n_rpn = jnp.maximum(rpn_w.sum(), 1.0)
  rpn_obj = (
    optax.sigmoid_binary_cross_entropy(f32(out['rpn_logits']), rpn_pos) * rpn_w
  ).sum() / n_rpn
  rpn_box = (
    smooth_l1(f32(out['rpn_deltas']) - out['rpn_box_targets'], 1.0 / 9).sum(-1) * rpn_pos
  ).sum() / n_rpn
  roi_w, roi_pos = f32(out['roi_valid']), f32(out['roi_positive'])
  n_roi = jnp.maximum(roi_w.sum(), 1.0)
  cls = (
    optax.softmax_cross_entropy_with_integer_labels(f32(out['cls_logits']), out['classes']) * roi_w
  ).sum() / n_roi
  box = (
    smooth_l1(f32(out['box_deltas']) - out['box_targets'], 1.0).sum(-1) * roi_pos
  ).sum() / n_roi
  mask_w = roi_pos[:, : out['mask_logits'].shape[1], None, None]
  pixels = jnp.maximum(mask_w.sum() * out['mask_targets'][0, 0].size, 1.0)
  # The slots past an image's positives hold other RoIs (or none): out of the loss entirely.
  mask_bce = optax.sigmoid_binary_cross_entropy(f32(out['mask_logits']), out['mask_targets'])
  mask = jnp.where(mask_w > 0, mask_bce, 0.0).sum() / pixels
  total = rpn_obj + rpn_box + cls + box + mask
  return total, {
    'loss_objectness': rpn_obj,
    'loss_rpn_box_reg': rpn_box,
    'loss_classifier': cls,
    'loss_box_reg': box,
    'loss_mask': mask,
  }
