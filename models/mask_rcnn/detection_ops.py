"""Static-shape detection ops for Mask R-CNN (He et al. 2017): anchors, box coding, IoU, NMS,
balanced sampling and multilevel RoIAlign.

Boxes are (x1, y1, x2, y2) in pixels with maskrcnn-benchmark's legacy convention that a box
spans x2 - x1 + 1 pixels (TO_REMOVE = 1 in its BoxCoder and boxlist_iou). Every function works
on one image; the model vmaps them over the batch.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from models.layers import gather

TO_REMOVE = 1.0
BBOX_XFORM_CLIP = math.log(1000.0 / 16)  # maskrcnn-benchmark's clamp of dw, dh before exp


def cell_anchors(stride, size, ratios):
  """Detectron's generate_anchors for one size: [A, 4] anchors centred on the first cell."""
  ctr = 0.5 * (stride - 1)
  area = float(stride * stride)
  anchors = []
  for ratio in ratios:
    # Detectron rounds the base widths and heights before scaling them.
    w = np.round(np.sqrt(area / ratio))
    h = np.round(w * ratio)
    w, h = w * size / stride, h * size / stride
    anchors.append(
      [ctr - 0.5 * (w - 1), ctr - 0.5 * (h - 1), ctr + 0.5 * (w - 1), ctr + 0.5 * (h - 1)]
    )
  return np.asarray(anchors, np.float32)


def grid_anchors(stride, size, ratios, height, width):
  """[height * width * A, 4] anchors in (y, x, a) order, matching an NHWC head's reshape."""
  base_Ax4 = jnp.asarray(cell_anchors(stride, size, ratios))
  ys = jnp.arange(height, dtype=jnp.float32) * stride
  xs = jnp.arange(width, dtype=jnp.float32) * stride
  shift_HxWx4 = jnp.stack(
    jnp.broadcast_arrays(xs[None, :], ys[:, None], xs[None, :], ys[:, None]), axis=-1
  )
  return (shift_HxWx4[:, :, None, :] + base_Ax4[None, None]).reshape(-1, 4)


def box_area(boxes):
  return (boxes[..., 2] - boxes[..., 0] + TO_REMOVE) * (boxes[..., 3] - boxes[..., 1] + TO_REMOVE)


def pairwise_iou(a_Nx4, b_Mx4):
  """IoU of every box of `a` with every box of `b`: [N, M]."""
  lt = jnp.maximum(a_Nx4[:, None, :2], b_Mx4[None, :, :2])
  rb = jnp.minimum(a_Nx4[:, None, 2:], b_Mx4[None, :, 2:])
  wh = jnp.maximum(rb - lt + TO_REMOVE, 0.0)
  inter = wh[..., 0] * wh[..., 1]
  return inter / (box_area(a_Nx4)[:, None] + box_area(b_Mx4)[None, :] - inter)


def _centre_size(boxes):
  w = boxes[..., 2] - boxes[..., 0] + TO_REMOVE
  h = boxes[..., 3] - boxes[..., 1] + TO_REMOVE
  return boxes[..., 0] + 0.5 * w, boxes[..., 1] + 0.5 * h, w, h


def encode(gt_boxes, ref_boxes, weights):
  """Regression targets (dx, dy, dw, dh) of `gt_boxes` relative to `ref_boxes`."""
  wx, wy, ww, wh = weights
  gx, gy, gw, gh = _centre_size(gt_boxes)
  rx, ry, rw, rh = _centre_size(ref_boxes)
  return jnp.stack(
    [wx * (gx - rx) / rw, wy * (gy - ry) / rh, ww * jnp.log(gw / rw), wh * jnp.log(gh / rh)],
    axis=-1,
  )


def decode(deltas, ref_boxes, weights):
  """Inverse of `encode`, with dw and dh clamped as the reference does."""
  wx, wy, ww, wh = weights
  rx, ry, rw, rh = _centre_size(ref_boxes)
  dx, dy = deltas[..., 0] / wx, deltas[..., 1] / wy
  dw = jnp.minimum(deltas[..., 2] / ww, BBOX_XFORM_CLIP)
  dh = jnp.minimum(deltas[..., 3] / wh, BBOX_XFORM_CLIP)
  cx, cy = dx * rw + rx, dy * rh + ry
  w, h = jnp.exp(dw) * rw, jnp.exp(dh) * rh
  return jnp.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w - 1, cy + 0.5 * h - 1], axis=-1)


def clip_boxes(boxes, height, width):
  return jnp.stack(
    [
      jnp.clip(boxes[..., 0], 0, width - TO_REMOVE),
      jnp.clip(boxes[..., 1], 0, height - TO_REMOVE),
      jnp.clip(boxes[..., 2], 0, width - TO_REMOVE),
      jnp.clip(boxes[..., 3], 0, height - TO_REMOVE),
    ],
    axis=-1,
  )


def nms(boxes_Nx4, valid_N, threshold):
  """Greedy NMS of boxes sorted by decreasing score, as a padded fixed point.

  Box i survives iff no surviving higher-scored box overlaps it by IoU > threshold. That rule
  has one fixed point (by induction on i), the greedy result, and iterating it from "all
  valid boxes survive" fixes at least one more leading position per round, so the loop ends
  in at most N rounds; in practice suppression chains are short and it takes a handful, each
  one [N, N] masked reduction instead of N sequential steps.
  """
  n = boxes_Nx4.shape[0]
  earlier = jnp.arange(n)[None, :] < jnp.arange(n)[:, None]  # [i, j]: j scores above i
  suppresses = (pairwise_iou(boxes_Nx4, boxes_Nx4) > threshold) & earlier

  def step(keep):
    return valid_N & ~jnp.any(suppresses & keep[None, :], axis=1)

  def body(carry):
    keep, _ = carry
    new = step(keep)
    return new, jnp.any(new != keep)

  keep, _ = jax.lax.while_loop(lambda c: c[1], body, (valid_N, jnp.array(True)))
  return keep


def match(iou_NxG, gt_valid_G, fg_threshold, bg_threshold, low_quality):
  """maskrcnn-benchmark's Matcher: (best gt index [N], label [N] in {1 fg, 0 bg, -1 ignore}).

  Padding instances get IoU -1, so they are never anyone's best match nor a low-quality one.
  """
  iou = jnp.where(gt_valid_G[None, :], iou_NxG, -1.0)
  best, index = iou.max(axis=1), jnp.argmax(iou, axis=1)
  label = jnp.where(best >= fg_threshold, 1, jnp.where(best < bg_threshold, 0, -1))
  if low_quality:
    # Each gt's best predictions are positive too (ties included), keeping their own best gt.
    gt_best_G = iou.max(axis=0)
    is_best = (iou == gt_best_G[None, :]) & gt_valid_G[None, :] & (gt_best_G[None, :] > 0)
    label = jnp.where(jnp.any(is_best, axis=1), 1, label)
  return index, label


def sample(priority_N, positive_N, negative_N, size, positive_fraction):
  """A balanced sampler with a fixed output size, as maskrcnn-benchmark's sampler.

  Draws min(#positive, size * fraction) random positives into the first slots, then random
  negatives into the rest. Returns (indices [size], is_positive [size], valid [size]); a slot
  is invalid only when the candidates run out.
  """
  max_pos = int(size * positive_fraction)
  # priority_N: uniform [0, 1) draws. Positives and negatives are disjoint, so one draw
  # orders both at random.
  pos_prio = jnp.where(positive_N, priority_N, -1.0)
  neg_prio = jnp.where(negative_N, priority_N, -1.0)
  pos_idx = jax.lax.top_k(pos_prio, max_pos)[1]
  neg_idx = jax.lax.top_k(neg_prio, size)[1]
  num_pos = jnp.minimum(positive_N.sum(), max_pos)
  num_neg = jnp.minimum(negative_N.sum(), size - num_pos)
  slot = jnp.arange(size)
  is_pos = slot < num_pos
  index = jnp.where(
    is_pos, pos_idx[jnp.minimum(slot, max_pos - 1)], neg_idx[jnp.clip(slot - num_pos, 0, size - 1)]
  )
  return index, is_pos, is_pos | (slot - num_pos < num_neg)


def roi_levels(boxes_Rx4, num_levels, canonical_scale=224, canonical_level=4, first_level=2):
  """maskrcnn-benchmark's LevelMapper (Eq. 1 of the FPN paper): index into the pooled levels."""
  scale = jnp.sqrt(box_area(boxes_Rx4))
  level = jnp.floor(canonical_level + jnp.log2(scale / canonical_scale + 1e-6))
  return (jnp.clip(level, first_level, first_level + num_levels - 1) - first_level).astype(
    jnp.int32
  )


def _interp(coord, size):
  """Legacy RoIAlign's bilinear taps along one axis: low/high index and their weights."""
  size = size.astype(coord.dtype)
  inside = (coord >= -1.0) & (coord <= size)
  c = jnp.maximum(coord, 0.0)
  low = jnp.floor(c)
  at_edge = low >= size - 1
  low = jnp.where(at_edge, size - 1, low)
  c = jnp.where(at_edge, low, c)
  high = jnp.minimum(low + 1, size - 1)
  frac = c - low
  return low.astype(jnp.int32), high.astype(jnp.int32), (1 - frac) * inside, frac * inside


def multilevel_roi_align(features, boxes_Rx4, levels_R, strides, output_size, sampling_ratio):
  """RoIAlign (maskrcnn-benchmark's legacy, aligned=False) of each box on its own level.

  features: per-level [H_l, W_l, C] maps of one image. All levels are flattened into one
  [sum H_l W_l, C] table so every box gathers its taps from its own level by index
  arithmetic: one gather for all boxes and levels, no per-box or per-level loop. Many boxes
  share taps, so the gather's gradient sums in float32 (`gather.take_rows`) under bf16 too.
  Returns [R, output_size, output_size, C].
  """
  heights = jnp.asarray([f.shape[0] for f in features], jnp.int32)
  widths = jnp.asarray([f.shape[1] for f in features], jnp.int32)
  sizes = [f.shape[0] * f.shape[1] for f in features]
  offsets = jnp.asarray(np.concatenate([[0], np.cumsum(sizes)[:-1]]), jnp.int32)
  table = jnp.concatenate([f.reshape(-1, f.shape[-1]) for f in features], axis=0)
  scale = 1.0 / jnp.asarray(strides, jnp.float32)[levels_R]
  h, w, offset = heights[levels_R], widths[levels_R], offsets[levels_R]
  box = boxes_Rx4 * scale[:, None]
  bin_w = jnp.maximum(box[:, 2] - box[:, 0], 1.0) / output_size
  bin_h = jnp.maximum(box[:, 3] - box[:, 1], 1.0) / output_size
  # Sample sampling_ratio^2 points per bin, at the centres of a regular sub-grid.
  grid = (jnp.arange(output_size * sampling_ratio, dtype=jnp.float32) + 0.5) / sampling_ratio
  ys = box[:, 1:2] + grid[None, :] * bin_h[:, None]
  xs = box[:, 0:1] + grid[None, :] * bin_w[:, None]
  y_lo, y_hi, wy_lo, wy_hi = _interp(ys, h[:, None])
  x_lo, x_hi, wx_lo, wx_hi = _interp(xs, w[:, None])
  out = 0.0
  for yi, wy in ((y_lo, wy_lo), (y_hi, wy_hi)):
    for xi, wx in ((x_lo, wx_lo), (x_hi, wx_hi)):
      index = offset[:, None, None] + yi[:, :, None] * w[:, None, None] + xi[:, None, :]
      weight = (wy[:, :, None] * wx[:, None, :]).astype(table.dtype)
      out = out + gather.take_rows(table, index) * weight[..., None]
  r, s, c = boxes_Rx4.shape[0], sampling_ratio, table.shape[-1]
  out = out.reshape(r, output_size, s, output_size, s, c)
  return out.mean(axis=(2, 4))


def _interp_matrix(coord_P, size):
  """[P, size] bilinear weights sampling a 1-D signal at pixel coordinates (zero outside)."""
  low = jnp.floor(coord_P)
  frac = coord_P - low
  cols = jnp.arange(size, dtype=jnp.float32)[None, :]
  return (cols == low[:, None]) * (1 - frac)[:, None] + (cols == low[:, None] + 1) * frac[:, None]


def project_masks(gt_mask_MxM, gt_box, roi_box, size):
  """The binary size x size mask target of one RoI from a gt mask stored in its box's frame.

  maskrcnn-benchmark crops the gt polygon to the RoI and rasterizes it at size x size; here
  the gt mask lives on an M x M grid over its own box, so each target cell centre is mapped
  into that grid, sampled bilinearly (zero outside the gt box) and thresholded at 0.5.
  """
  m = gt_mask_MxM.shape[0]
  cells = (jnp.arange(size, dtype=jnp.float32) + 0.5) / size
  xs = roi_box[0] + cells * (roi_box[2] - roi_box[0] + TO_REMOVE)
  ys = roi_box[1] + cells * (roi_box[3] - roi_box[1] + TO_REMOVE)
  gx = (xs - gt_box[0]) / (gt_box[2] - gt_box[0] + TO_REMOVE) * m - 0.5
  gy = (ys - gt_box[1]) / (gt_box[3] - gt_box[1] + TO_REMOVE) * m - 0.5
  wy, wx = _interp_matrix(gy, m), _interp_matrix(gx, m)
  return (wy @ gt_mask_MxM.astype(jnp.float32) @ wx.T >= 0.5).astype(jnp.float32)
