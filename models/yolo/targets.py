"""YOLOv3's anchor matching and loss (Redmon & Farhadi 2018), over static-shape padded boxes.

Ground truth arrives padded to a fixed number of boxes per image with a validity mask, and
becomes dense per-scale targets by scatter, so the whole train step compiles once.
Boxes are (cx, cy, w, h), normalized to the image; anchors are normalized likewise.
"""

import jax
import jax.numpy as jnp
import optax
from jax.scipy.special import xlogy

# yolov3.cfg's ignore_thresh: predictions overlapping a truth by more are not negatives.
IGNORE_THRESH = 0.7


def wh_iou(wh_Nx2, anchors_Ax2):
  """IoU of boxes and anchors with their centres aligned (darknet's best-anchor test)."""
  inter = jnp.minimum(wh_Nx2[..., None, 0], anchors_Ax2[:, 0]) * jnp.minimum(
    wh_Nx2[..., None, 1], anchors_Ax2[:, 1]
  )
  union = (
    wh_Nx2[..., None, 0] * wh_Nx2[..., None, 1] + anchors_Ax2[:, 0] * anchors_Ax2[:, 1] - inter
  )
  return inter / jnp.maximum(union, 1e-12)


def box_iou(a, b):
  """IoU of (cx, cy, w, h) boxes, broadcasting over leading dimensions."""
  a_lo, a_hi = a[..., :2] - a[..., 2:] / 2, a[..., :2] + a[..., 2:] / 2
  b_lo, b_hi = b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2
  inter = jnp.prod(jnp.clip(jnp.minimum(a_hi, b_hi) - jnp.maximum(a_lo, b_lo), 0.0), axis=-1)
  union = jnp.prod(a[..., 2:], axis=-1) + jnp.prod(b[..., 2:], axis=-1) - inter
  return inter / jnp.maximum(union, 1e-12)


def build_targets(boxes_BxMx4, classes_BxM, valid_BxM, anchors_Ax2, grids, masks):
  """Dense targets per scale from padded boxes.

  Each valid box goes to the anchor (of all A) with the best shape IoU; the
  scale is the one whose mask holds that anchor, the cell the one holding the
  box centre. Returns, per scale, a dict of arrays over (B, G, G, anchors):
  'obj' (1 where a box was assigned), 'txy' in-cell centre offsets, 'twh' log
  size ratios to the anchor, 'weight' darknet's 2 - w*h, 'cls' the class id.
  When two boxes land on one cell and anchor, the later box wins (deterministic).
  """
  batch, max_boxes = classes_BxM.shape
  best = jnp.argmax(wh_iou(boxes_BxMx4[..., 2:], anchors_Ax2), axis=-1)  # B x M
  box_ids = jnp.broadcast_to(jnp.arange(max_boxes), (batch, max_boxes))
  targets = []
  for grid, mask in zip(grids, masks):
    mask = jnp.asarray(mask)
    here = (best[..., None] == mask).any(-1) & valid_BxM
    slot = jnp.argmax(best[..., None] == mask, axis=-1)  # the anchor's index within this scale
    cell_xy = jnp.clip(jnp.floor(boxes_BxMx4[..., :2] * grid), 0, grid - 1).astype(jnp.int32)
    flat = (cell_xy[..., 1] * grid + cell_xy[..., 0]) * len(mask) + slot
    size = grid * grid * len(mask)
    # Boxes not on this scale (and padding) scatter out of bounds and are dropped.
    flat = jnp.where(here, flat, size)
    winner = jnp.full((batch, size), -1, jnp.int32)
    winner = jax.vmap(lambda w, f, i: w.at[f].max(i, mode='drop'))(winner, flat, box_ids)
    assigned = winner >= 0
    owner = jnp.maximum(winner, 0)[
      ..., None
    ]  # the box each cell-anchor slot takes its targets from
    pick = lambda x, owner=owner: jnp.take_along_axis(x, owner, axis=1)
    per_box_txy = boxes_BxMx4[..., :2] * grid - cell_xy
    # Padding boxes may have zero size; keep their (never used) targets finite.
    safe_wh = jnp.where(valid_BxM[..., None], jnp.maximum(boxes_BxMx4[..., 2:], 1e-9), 1.0)
    per_box_twh = jnp.log(safe_wh / anchors_Ax2[best])
    per_box_weight = 2.0 - boxes_BxMx4[..., 2] * boxes_BxMx4[..., 3]
    shape = (batch, grid, grid, len(mask))
    targets.append(
      {
        'obj': assigned.astype(jnp.float32).reshape(shape),
        'txy': pick(per_box_txy).reshape(shape + (2,)),
        'twh': pick(per_box_twh).reshape(shape + (2,)),
        'weight': pick(per_box_weight[..., None])[..., 0].reshape(shape),
        'cls': pick(classes_BxM[..., None])[..., 0].reshape(shape),
      }
    )
  return targets


def decode_boxes(raw_BxGxGxAxK, anchors_Ax2):
  """Predicted (cx, cy, w, h) boxes of one scale, normalized to the image."""
  grid = raw_BxGxGxAxK.shape[1]
  col = jnp.arange(grid, dtype=jnp.float32)
  offsets = jnp.stack(jnp.broadcast_arrays(col[None, :], col[:, None]), -1)[:, :, None]  # x, y
  xy = (offsets + jax.nn.sigmoid(raw_BxGxGxAxK[..., :2])) / grid
  wh = jnp.exp(raw_BxGxGxAxK[..., 2:4]) * anchors_Ax2
  return jnp.concatenate([xy, wh], -1)


def ignore_mask(raw_BxGxGxAxK, anchors_Ax2, boxes_BxMx4, valid_BxM):
  """1 where a prediction overlaps some valid truth by more than IGNORE_THRESH."""
  pred = decode_boxes(raw_BxGxGxAxK, anchors_Ax2)
  batch = pred.shape[0]
  pred_BxNx4 = pred.reshape(batch, -1, 4)
  iou_BxNxM = box_iou(pred_BxNx4[:, :, None], boxes_BxMx4[:, None])
  best = jnp.max(jnp.where(valid_BxM[:, None], iou_BxNxM, 0.0), axis=-1)
  return jax.lax.stop_gradient((best > IGNORE_THRESH).astype(jnp.float32)).reshape(pred.shape[:-1])


def soft_bce(logits, targets):
  """BCE against soft targets minus the targets' entropy: 0 at the optimum, same gradient."""
  entropy = -(xlogy(targets, targets) + xlogy(1.0 - targets, 1.0 - targets))
  return optax.sigmoid_binary_cross_entropy(logits, targets) - entropy


def yolo_loss(outputs, boxes_BxMx4, classes_BxM, valid_BxM, anchors_Ax2, masks):
  """The YOLOv3 loss, summed over predictions and averaged over images.

  Each term's gradient with respect to the raw outputs is darknet's delta
  (yolo_layer.c): box centres (2 - w*h) * (sigmoid(t) - target) (a BCE on the
  in-cell offset), box sizes (2 - w*h) * (t - log(w / anchor)) (half squared
  error), objectness and classes BCE; predictions that are not a box's best
  anchor but overlap a truth by > IGNORE_THRESH are not pushed towards 'no object'.
  """
  grids = [raw.shape[1] for raw in outputs]
  targets = build_targets(boxes_BxMx4, classes_BxM, valid_BxM, anchors_Ax2, grids, masks)
  batch = boxes_BxMx4.shape[0]
  terms = {'xy': 0.0, 'wh': 0.0, 'obj': 0.0, 'noobj': 0.0, 'cls': 0.0}
  for raw, tgt, mask in zip(outputs, targets, masks):
    raw = raw.astype(jnp.float32)
    scale_anchors = anchors_Ax2[jnp.asarray(mask)]
    pos, weight = tgt['obj'], tgt['obj'] * tgt['weight']
    negative = (1.0 - pos) * (1.0 - ignore_mask(raw, scale_anchors, boxes_BxMx4, valid_BxM))
    terms['xy'] += (weight[..., None] * soft_bce(raw[..., :2], tgt['txy'])).sum()
    terms['wh'] += (weight[..., None] * 0.5 * jnp.square(raw[..., 2:4] - tgt['twh'])).sum()
    terms['obj'] += (pos * optax.sigmoid_binary_cross_entropy(raw[..., 4], 1.0)).sum()
    terms['noobj'] += (negative * optax.sigmoid_binary_cross_entropy(raw[..., 4], 0.0)).sum()
    one_hot = jax.nn.one_hot(tgt['cls'], raw.shape[-1] - 5)
    terms['cls'] += (
      pos[..., None] * optax.sigmoid_binary_cross_entropy(raw[..., 5:], one_hot)
    ).sum()
  terms = {k: v / batch for k, v in terms.items()}
  return sum(terms.values()), terms
