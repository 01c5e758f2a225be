"""YOLOv3: darknet's parameter count, anchor matching onto scale/cell/anchor, padding, loss."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import precision
from models import workload as wl
from models.yolo import targets as yolo_targets
from models.yolo import yolo

CFG = yolo.YOLOV3.resolve()
GRIDS = (19, 38, 76)


def _darknet_yolov3_params(classes=80):
  """Trainable parameters of darknet's cfg/yolov3.cfg, from its layer shapes: every
  convolution but the three detection ones is bias-free with batch norm (scale and shift), the
  detection convolutions are 1x1 with a bias and 3 x (5 + classes) outputs."""
  conv_bn = lambda k, cin, cout: k * k * cin * cout + 2 * cout
  detect = lambda cin: cin * 3 * (5 + classes) + 3 * (5 + classes)
  count, c = conv_bn(3, 3, 32), 32
  for blocks in (1, 2, 8, 8, 4):  # Darknet-53: a stride-2 convolution, then residual blocks
    count += conv_bn(3, c, 2 * c) + blocks * (conv_bn(1, 2 * c, c) + conv_bn(3, c, 2 * c))
    c *= 2

  def head(cin, w):  # five alternating 1x1/3x3 convolutions, a 3x3 and the detection layer
    return (
      conv_bn(1, cin, w)
      + 2 * (conv_bn(3, w, 2 * w) + conv_bn(1, 2 * w, w))
      + (conv_bn(3, w, 2 * w) + detect(2 * w))
    )

  # The 1x1 convolutions before each upsampling; the routes concatenate 256 + 512, 128 + 256.
  count += head(1024, 512) + conv_bn(1, 512, 256) + head(768, 256) + conv_bn(1, 256, 128)
  return count + head(384, 128)


def test_param_count_matches_darknet():
  trainer = yolo.YOLOV3.trainer(CFG, precision.get('fp32'))
  state = jax.eval_shape(trainer.init, jax.random.key(0))
  assert wl.count_params(state.params) == _darknet_yolov3_params()


def test_output_shapes_at_608():
  model = yolo.YOLOv3(CFG)
  batch = jax.eval_shape(lambda: yolo.make_batch(CFG, jax.random.key(0), 1))
  outputs, _ = jax.eval_shape(
    lambda b: model.init_with_output(jax.random.key(0), b, train=False), batch
  )
  assert [o.shape for o in outputs] == [(1, g, g, 3, 85) for g in GRIDS]


def _px_box(cx, cy, w, h):
  return [cx / 608, cy / 608, w / 608, h / 608]


@jax.jit
def _build(boxes, classes, valid):
  return yolo_targets.build_targets(
    boxes, classes, valid, yolo.anchors(CFG), GRIDS, yolo.ANCHOR_MASKS
  )


def _targets(boxes, classes, valid):
  return _build(
    jnp.asarray([boxes], jnp.float32), jnp.asarray([classes], jnp.int32), jnp.asarray([valid])
  )


def test_each_box_lands_on_its_scale_cell_and_anchor():
  boxes = [
    _px_box(300, 100, 116, 90),  # anchor 6: stride 32, first anchor, cell (x 9, y 3)
    _px_box(500, 20, 10, 13),  # anchor 0: stride 8, first anchor, cell (62, 2)
    _px_box(40, 600, 62, 45),  # anchor 4: stride 16, second anchor, cell (2, 37)
    _px_box(304, 304, 150, 200),  # anchor 7: stride 32, second anchor, cell (9, 9)
  ]
  classes = [3, 17, 42, 79]
  targets = _targets(boxes, classes, [True] * 4)
  expected = [(0, 3, 9, 0, 0), (2, 2, 62, 0, 1), (1, 37, 2, 1, 2), (0, 9, 9, 1, 3)]
  for scale, row, col, anchor, box in expected:
    t = targets[scale]
    assert t['obj'][0, row, col, anchor] == 1.0
    assert t['cls'][0, row, col, anchor] == classes[box]
    cx, cy, w, h = boxes[box]
    grid = GRIDS[scale]
    np.testing.assert_allclose(
      t['txy'][0, row, col, anchor], [cx * grid - col, cy * grid - row], rtol=1e-5
    )
    aw, ah = CFG['anchors'][yolo.ANCHOR_MASKS[scale][anchor]]
    np.testing.assert_allclose(
      t['twh'][0, row, col, anchor],
      [math.log(w * 608 / aw), math.log(h * 608 / ah)],
      rtol=1e-5,
      atol=1e-6,
    )
    np.testing.assert_allclose(t['weight'][0, row, col, anchor], 2 - w * h, rtol=1e-6)
  # Nothing else is a target: two boxes on the coarse scale, one on each other scale.
  assert [float(t['obj'].sum()) for t in targets] == [2.0, 1.0, 1.0]


def test_padding_boxes_never_become_targets():
  real = [_px_box(300, 100, 116, 90)]
  padding = [_px_box(100, 100, 116, 90), _px_box(500, 500, 10, 13), [0.0, 0.0, 0.0, 0.0]]
  targets = _targets(real + padding, [1, 2, 3, 4], [True, False, False, False])
  assert [float(t['obj'].sum()) for t in targets] == [1.0, 0.0, 0.0]
  assert all(np.isfinite(np.asarray(v)).all() for t in targets for v in t.values())


def test_loss_ignores_padding_on_a_synthetic_batch():
  cfg = yolo.YOLOV3.resolve(tiny=True)
  make_batch = jax.jit(lambda key: yolo.make_batch(cfg, key, 4))
  batch = make_batch(jax.random.key(3))
  valid = batch['valid']
  assert valid.any(axis=1).all() and not valid.all()  # real boxes, and padding, in each image
  # Raw head outputs of the tiny model's shapes (grids 2, 4, 8): the loss is under test.
  rng = np.random.default_rng(0)
  outputs = [jnp.asarray(rng.normal(size=(4, g, g, 3, 85)), jnp.float32) for g in (2, 4, 8)]
  other = make_batch(jax.random.key(4))
  scrambled = dict(
    batch,
    boxes=jnp.where(valid[..., None], batch['boxes'], other['boxes']),
    classes=jnp.where(valid, batch['classes'], other['classes']),
  )
  loss = jax.jit(lambda o, b: yolo.loss(cfg, o, b))
  value, terms = loss(outputs, batch)
  assert np.isfinite(value) and terms['obj'] > 0
  np.testing.assert_allclose(loss(outputs, scrambled)[0], value, rtol=1e-6)


def test_overlapping_predictions_are_not_negatives():
  anchors = yolo.anchors(CFG)[jnp.asarray(yolo.ANCHOR_MASKS[0])]
  raw = jnp.zeros((1, 19, 19, 3, 85))
  # With zero outputs, the prediction of cell (x 4, y 7), anchor 1 is exactly this box.
  truth = jnp.asarray([[[4.5 / 19, 7.5 / 19, anchors[1, 0], anchors[1, 1]]]])
  mask = jax.jit(yolo_targets.ignore_mask)
  ignore = mask(raw, anchors, truth, jnp.asarray([[True]]))
  assert ignore[0, 7, 4, 1] == 1.0
  assert ignore[0, 0, 0, 1] == 0.0
  assert ignore[0, 7, 4, 0] == 0.0  # the smaller anchor overlaps it by less than 0.7
  assert mask(raw, anchors, truth, jnp.asarray([[False]])).sum() == 0


@pytest.mark.parametrize('iou, ignored', [(0.65, 0.0), (0.75, 1.0)])
def test_predictions_are_ignored_above_yolov3_cfgs_threshold(iou, ignored):
  """yolov3.cfg's ignore_thresh = .7: a prediction overlapping a truth by 0.65 is a negative."""
  anchors = yolo.anchors(CFG)[jnp.asarray(yolo.ANCHOR_MASKS[0])]
  raw = jnp.zeros((1, 19, 19, 3, 85))
  # The prediction of cell (x 4, y 7), anchor 1 and a truth of the same centre and height,
  # narrower by the factor `iou`: their IoU is `iou`.
  truth = jnp.asarray([[[4.5 / 19, 7.5 / 19, anchors[1, 0] * iou, anchors[1, 1]]]])
  ignore = jax.jit(yolo_targets.ignore_mask)(raw, anchors, truth, jnp.asarray([[True]]))
  assert ignore[0, 7, 4, 1] == ignored


def test_box_size_gradient_is_darknets_delta():
  """d loss / d tw = (2 - w h) (tw - log(w / anchor)), per image, on a positive."""
  box = _px_box(300, 100, 100, 80)
  raw = [jnp.full((1, g, g, 3, 85), 0.3) for g in GRIDS]
  grads = jax.jit(
    jax.grad(
      lambda r: yolo_targets.yolo_loss(
        r,
        jnp.asarray([[box]]),
        jnp.asarray([[5]]),
        jnp.asarray([[True]]),
        yolo.anchors(CFG),
        yolo.ANCHOR_MASKS,
      )[0]
    )
  )(raw)
  aw, ah = CFG['anchors'][6]
  weight = 2 - box[2] * box[3]
  np.testing.assert_allclose(
    grads[0][0, 3, 9, 0, 2], weight * (0.3 - math.log(100 / aw)), rtol=1e-5
  )
  np.testing.assert_allclose(grads[0][0, 3, 9, 0, 3], weight * (0.3 - math.log(80 / ah)), rtol=1e-5)


def test_flops_match_darknets_figure():
  # darknet (and the YOLOv3 site) gives 140.69 BFLOPs for one forward pass of YOLOv3-608.
  forward = yolo.YOLOV3.flops_per_example(CFG) / 3
  np.testing.assert_allclose(forward, 140.69e9, rtol=1e-4)
