"""Mask R-CNN: the static-shape detection ops against direct references, and the workload."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import precision
from models import workload as wl
from models.mask_rcnn import data as mask_rcnn_data
from models.mask_rcnn import detection_ops as ops
from models.mask_rcnn import mask_rcnn as mr
from models.mask_rcnn import nets, resnet_fpn
from models.mask_rcnn import targets as mask_rcnn_targets
from tests import tiny as shared

TINY = mr.MASK_RCNN.resolve(tiny=True)


def _random_boxes(rng, n, size):
  xy = rng.uniform(0, size * 0.8, (n, 2))
  wh = rng.uniform(4, size * 0.4, (n, 2))
  return np.concatenate([xy, xy + wh], axis=1).astype(np.float32)


def _iou(a, b):
  w = max(min(a[2], b[2]) - max(a[0], b[0]) + 1, 0)
  h = max(min(a[3], b[3]) - max(a[1], b[1]) + 1, 0)
  area = lambda x: (x[2] - x[0] + 1) * (x[3] - x[1] + 1)
  return w * h / (area(a) + area(b) - w * h)


def test_detectron_cell_anchors():
  # By hand from Detectron's generate_anchors: stride 4, size 32, ratios 0.5, 1, 2.
  expected = [[-22, -10, 25, 13], [-14, -14, 17, 17], [-10, -22, 13, 25]]
  np.testing.assert_array_equal(ops.cell_anchors(4, 32, (0.5, 1.0, 2.0)), expected)
  grid = ops.grid_anchors(4, 32, (0.5, 1.0, 2.0), 2, 3)
  np.testing.assert_array_equal(grid[3 * 4 + 1], np.array(expected[1]) + [4, 4, 4, 4])


def test_nms_matches_greedy_reference():
  rng = np.random.default_rng(0)
  for threshold in (0.3, 0.7):
    boxes = _random_boxes(rng, 80, 64)
    valid = rng.uniform(size=80) > 0.1
    keep = np.asarray(jax.jit(ops.nms, static_argnums=2)(boxes, valid, threshold))
    expected = np.zeros(80, bool)
    for i in range(80):
      expected[i] = valid[i] and not any(
        expected[j] and _iou(boxes[j], boxes[i]) > threshold for j in range(i)
      )
    np.testing.assert_array_equal(keep, expected)
    assert 0 < keep.sum() < valid.sum()  # suppression happened


def _roi_align_reference(feature, box, stride, out, ratio):
  """maskrcnn-benchmark's legacy ROIAlign forward, one sample point at a time."""
  h, w, c = feature.shape
  x1, y1, x2, y2 = np.asarray(box, np.float64) / stride
  bin_h, bin_w = max(y2 - y1, 1.0) / out, max(x2 - x1, 1.0) / out
  result = np.zeros((out, out, c))

  def bilinear(y, x):
    if y < -1.0 or y > h or x < -1.0 or x > w:
      return np.zeros(c)
    y, x = max(y, 0.0), max(x, 0.0)
    yl, xl = int(y), int(x)
    yh, xh = min(yl + 1, h - 1), min(xl + 1, w - 1)
    if yl >= h - 1:
      yl = yh = h - 1
      y = float(yl)
    if xl >= w - 1:
      xl = xh = w - 1
      x = float(xl)
    ly, lx = y - yl, x - xl
    return (
      (1 - ly) * (1 - lx) * feature[yl, xl]
      + (1 - ly) * lx * feature[yl, xh]
      + ly * (1 - lx) * feature[yh, xl]
      + ly * lx * feature[yh, xh]
    )

  for ph in range(out):
    for pw in range(out):
      for iy in range(ratio):
        for ix in range(ratio):
          result[ph, pw] += bilinear(
            y1 + ph * bin_h + (iy + 0.5) * bin_h / ratio,
            x1 + pw * bin_w + (ix + 0.5) * bin_w / ratio,
          )
  return result / ratio**2


def test_multilevel_roi_align_matches_direct_bilinear():
  rng = np.random.default_rng(1)
  strides = (4, 8, 16)
  features = [rng.normal(size=(64 // s, 48 // s, 3)).astype(np.float32) for s in strides]
  boxes = np.concatenate([_random_boxes(rng, 8, 48), [[-6, -5, 70, 60], [40, 50, 47, 63]]])
  levels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0], np.int32)
  got = jax.jit(ops.multilevel_roi_align, static_argnums=(3, 4, 5))(
    features, boxes, levels, strides, 5, 2
  )
  for i, (box, level) in enumerate(zip(boxes, levels)):
    expected = _roi_align_reference(features[level], box, strides[level], 5, 2)
    np.testing.assert_allclose(got[i], expected, rtol=1e-5, atol=1e-5)


def test_roi_levels_follow_fpn_equation():
  side = np.array([32, 111, 112, 224, 448, 900], np.float32) - 1
  boxes = np.stack([np.zeros(6), np.zeros(6), side, side], axis=1)
  np.testing.assert_array_equal(ops.roi_levels(boxes, 4), [0, 0, 1, 2, 3, 3])


@pytest.mark.parametrize('num_pos,num_neg', [(300, 600), (10, 900), (10, 100), (0, 700)])
def test_sampler_fixed_count_and_fraction(num_pos, num_neg):
  n, size = 1000, 512
  rng = np.random.default_rng(num_pos + num_neg)
  kind = rng.permutation(np.repeat([1, 0, -1], [num_pos, num_neg, n - num_pos - num_neg]))
  priority = jax.random.uniform(jax.random.key(num_pos), (n,))
  idx, is_pos, valid = jax.jit(ops.sample, static_argnums=(3, 4))(
    priority, kind == 1, kind == 0, size, 0.25
  )
  idx, is_pos, valid = map(np.asarray, (idx, is_pos, valid))
  assert idx.shape == is_pos.shape == valid.shape == (size,)
  assert is_pos.sum() == min(num_pos, size // 4)
  assert valid.sum() == min(num_pos, size // 4) + min(num_neg, size - min(num_pos, size // 4))
  assert np.all(kind[idx[is_pos]] == 1) and np.all(kind[idx[valid & ~is_pos]] == 0)
  assert len(set(idx[valid].tolist())) == valid.sum()  # no candidate drawn twice


@pytest.mark.slow
def test_padding_instances_never_become_targets():
  batch = jax.jit(lambda key: mask_rcnn_data.make_batch(TINY, key, 1))(jax.random.key(3))
  image = jax.tree.map(lambda x: x[0], batch)
  count = int(image['gt_valid'].sum())
  assert 0 < count < TINY['max_instances']
  h, w = TINY['content_size']
  full = jnp.array([0, 0, w - 1, h - 1], jnp.float32)
  # Padding that would win every match if it were not masked: full-image boxes and masks.
  pad = ~image['gt_valid']
  loud = dict(
    image,
    gt_boxes=jnp.where(pad[:, None], full, image['gt_boxes']),
    gt_classes=jnp.where(pad, 7, image['gt_classes']),
    gt_masks=jnp.where(pad[:, None, None], 1, image['gt_masks']).astype(jnp.uint8),
  )
  proposals = jnp.concatenate([_random_boxes(np.random.default_rng(0), 31, 60), full[None]])
  priority = jax.random.uniform(jax.random.key(0), (1200,))

  def targets(gt):
    roi = mask_rcnn_targets.roi_targets(
      TINY,
      priority[:38],
      proposals,
      jnp.ones(32, bool),
      gt['gt_boxes'],
      gt['gt_classes'],
      gt['gt_masks'],
      gt['gt_valid'],
    )
    anchors = jnp.concatenate(
      [
        ops.grid_anchors(4, 8, (0.5, 1.0, 2.0), 16, 16),
        ops.grid_anchors(8, 16, (0.5, 1.0, 2.0), 8, 8),
      ]
    )
    rpn = mask_rcnn_targets.rpn_targets(
      TINY, anchors, priority[: anchors.shape[0]], gt['gt_boxes'], gt['gt_valid']
    )
    return roi, rpn

  (roi, rpn), (roi_loud, rpn_loud) = jax.jit(targets)(image), jax.jit(targets)(loud)
  assert np.all(np.asarray(roi['roi_gt'])[np.asarray(roi['roi_positive'])] < count)
  assert roi['roi_positive'].sum() >= count  # the gt boxes themselves are positives
  for a, b in zip(jax.tree.leaves((roi, rpn)), jax.tree.leaves((roi_loud, rpn_loud))):
    np.testing.assert_array_equal(a, b)


def r101_fpn_parameters(classes=81, anchors=3, channels=256, mlp=1024, pool=7):
  """maskrcnn-benchmark's e2e_mask_rcnn_R_101_FPN_1x, counted layer by layer as its .parameters():
  convolution and linear weights and biases (the ResNet's convolutions have none). Its
  FrozenBatchNorm2d affines are buffers, not parameters. Returns each part's count."""
  conv = lambda k, cin, cout, bias=True: k * k * cin * cout + (cout if bias else 0)
  dense = lambda cin, cout: cin * cout + cout
  parts = {'stem': conv(7, 3, 64, bias=False)}
  cin = 64
  for i, blocks in enumerate((3, 4, 23, 3)):  # bottleneck width 64 * 2**i, output 4x that
    width = 64 * 2**i
    parts[f'res{i + 2}'] = conv(1, cin, 4 * width, bias=False)  # the first block's projection
    for _ in range(blocks):
      parts[f'res{i + 2}'] += (
        conv(1, cin, width, bias=False)
        + conv(3, width, width, bias=False)
        + conv(1, width, 4 * width, bias=False)
      )
      cin = 4 * width
  # Lateral 1x1 and output 3x3 convolutions on C2-C5 (256 to 2048 channels).
  parts['fpn'] = sum(conv(1, 256 * 2**i, channels) + conv(3, channels, channels) for i in range(4))
  parts['rpn'] = conv(3, channels, channels) + conv(1, channels, anchors + 4 * anchors)
  parts['box_head'] = (
    dense(channels * pool * pool, mlp)
    + dense(mlp, mlp)
    + dense(mlp, classes)
    + dense(mlp, 4 * classes)
  )
  parts['mask_head'] = (
    4 * conv(3, channels, channels) + conv(2, channels, channels) + conv(1, channels, classes)
  )
  return parts


@pytest.mark.slow
def test_full_size_parameter_count():
  cfg = mr.MASK_RCNN.resolve()
  trainer = mr.MASK_RCNN.trainer(cfg, precision.get('fp32'))
  shapes = jax.eval_shape(trainer.init, jax.random.key(0))
  # The frozen stem and res2 convolutions count, as in the reference's .parameters(); the
  # frozen batch norms are outside params (the reference's buffers).
  reference = r101_fpn_parameters()
  assert wl.count_params(shapes.params) == sum(reference.values())  # 63,287,477
  assert 'frozen_bn' in shapes.model_state and 'batch_stats' not in shapes.model_state
  frozen = shapes.params['backbone']
  frozen = wl.count_params(
    {k: v for k, v in frozen.items() if k == 'stem' or k.startswith('res2_')}
  )
  assert frozen == reference['stem'] + reference['res2']


@pytest.mark.slow
def test_step_compiles_once_finite_and_freezes_stem():
  state, batch = shared.start('mask_rcnn')
  step = jax.jit(shared.tiny('mask_rcnn').trainer.step)  # its own: the compiles counted are its
  new, metrics = step(state, batch, jax.random.key(2))
  new, metrics = step(new, batch, jax.random.key(2))
  assert step._cache_size() == 1
  for name, value in metrics.items():
    assert np.isfinite(value), name
  assert set(metrics) >= {
    'loss_objectness',
    'loss_rpn_box_reg',
    'loss_classifier',
    'loss_box_reg',
    'loss_mask',
  }
  before, after = state.params['backbone'], new.params['backbone']
  np.testing.assert_array_equal(before['stem']['kernel'], after['stem']['kernel'])
  np.testing.assert_array_equal(
    before['res2_0']['conv2']['kernel'], after['res2_0']['conv2']['kernel']
  )
  assert not np.array_equal(before['res3_0']['conv2']['kernel'], after['res3_0']['conv2']['kernel'])


@pytest.mark.slow
def test_deep_stage_keeps_unit_scale():
  # Identity shortcuts add up the residual branches: with each branch's frozen batch norm set to
  # unit scale, R-101's 23-block res4 left C4 at RMS 24 and the FPN levels at 22-25 at full size,
  # and the first SGD step diverged (NaN within 3 steps). Here 8 blocks went from 1.0 to 2.5.
  images = mask_rcnn_data.make_batch(TINY, jax.random.key(0), 2)['images']
  n = 8
  net = resnet_fpn.ResNetFPN((1, 1, n, 1), width=4, fpn_channels=8)

  @jax.jit
  def stage_rms(images):
    variables = net.init(jax.random.key(1), images)  # statistics of these same images
    _, inter = net.apply(variables, images, capture_intermediates=True, mutable=['intermediates'])
    outputs = [inter['intermediates'][f'res4_{j}']['__call__'][0] for j in range(n)]
    return jnp.stack([jnp.sqrt(jnp.mean(jnp.square(x))) for x in outputs])

  rms = np.asarray(stage_rms(images))
  assert np.all(rms < 1.5), rms  # the stage's n branches of scale 1/sqrt(n) add about 1


def test_frozen_bn_statistics_come_from_a_sample_not_the_init_batch():
  # One init image misjudged the training images' contrast (3-5x too large FPN features at full
  # size): the statistics come from frozen_bn_images synthetic images of the model's own.
  module = nets.MaskRCNN(TINY)
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  init = jax.jit(lambda key: module.init(rngs, mask_rcnn_data.make_batch(TINY, key, 1), False))
  first, second = init(jax.random.key(2)), init(jax.random.key(3))
  for a, b in zip(jax.tree.leaves(first['frozen_bn']), jax.tree.leaves(second['frozen_bn'])):
    np.testing.assert_array_equal(a, b)


def _tiny_proposals(batch):
  """Each image's top post_nms_top_n proposals and scores from random RPN outputs at tiny size,
  the first image's objectness raised by 1."""
  h, w = TINY['image_size']
  ratios = tuple(TINY['anchor_ratios'])
  anchors = [
    ops.grid_anchors(s, size, ratios, -(-h // s), -(-w // s))
    for s, size in zip(nets.strides(TINY), TINY['anchor_sizes'])
  ]
  keys = jax.random.split(jax.random.key(5), 2 * len(anchors))
  levels = [
    (
      jax.random.normal(keys[2 * i], (batch, a.shape[0])) + (jnp.arange(batch) == 0)[:, None],
      0.1 * jax.random.normal(keys[2 * i + 1], (batch, a.shape[0], 4)),
    )
    for i, a in enumerate(anchors)
  ]
  return jax.jit(jax.vmap(lambda o: mask_rcnn_targets.propose(TINY, o, anchors)))(levels)


@pytest.mark.slow
def test_proposals_are_kept_per_batch():
  # maskrcnn-benchmark keeps FPN_POST_NMS_TOP_N_TRAIN proposals for the whole batch in training:
  # the batch's top scores, however they fall between its images.
  n = TINY['post_nms_top_n']
  _, scores = _tiny_proposals(2)
  scores = np.asarray(scores)
  assert np.all(np.isfinite(scores))  # each image offers n proposals
  kept = np.asarray(mask_rcnn_targets.keep_proposals(TINY, scores))
  assert kept.sum() == n
  threshold = np.sort(scores.reshape(-1))[-n]
  np.testing.assert_array_equal(kept, scores >= threshold)
  assert kept[0].sum() > n // 2 > kept[1].sum() > 0  # the shares follow the scores
  per_image = np.asarray(mask_rcnn_targets.keep_proposals(dict(TINY, post_nms_per='image'), scores))
  assert per_image.sum(axis=1).tolist() == [n, n]


def test_per_batch_proposals_skip_suppressed_slots():
  n = TINY['post_nms_top_n']
  scores = np.full((3, n), -np.inf, np.float32)
  scores[0, :5] = np.arange(5)  # fewer survivors in the batch than the bound
  scores[2, :3] = 10.0
  kept = np.asarray(mask_rcnn_targets.keep_proposals(TINY, scores))
  np.testing.assert_array_equal(kept, np.isfinite(scores))


def test_mask_loss_ignores_slots_past_the_positives():
  rng = np.random.default_rng(2)
  b, r, m, p = 2, 8, 4, 6
  positive = np.zeros((b, r), bool)
  positive[0, :3], positive[1, :1] = True, True
  out = {
    'rpn_logits': np.zeros((b, 4), np.float32),
    'rpn_deltas': np.zeros((b, 4, 4), np.float32),
    'rpn_positive': np.zeros((b, 4), bool),
    'rpn_valid': np.ones((b, 4), bool),
    'rpn_box_targets': np.zeros((b, 4, 4), np.float32),
    'cls_logits': np.zeros((b, r, 3), np.float32),
    'classes': np.where(positive, 1, 0),
    'roi_valid': np.ones((b, r), bool),
    'roi_positive': positive,
    'box_deltas': np.zeros((b, r, 4), np.float32),
    'box_targets': np.zeros((b, r, 4), np.float32),
    'mask_logits': rng.normal(size=(b, m, p, p)).astype(np.float32),
    'mask_targets': (rng.uniform(size=(b, m, p, p)) > 0.5).astype(np.float32),
  }
  loss = lambda o: float(mask_rcnn_targets.loss(TINY, o, None)[1]['loss_mask'])
  base = loss(out)
  padded = ~positive[:, :m]
  noisy = dict(out)
  noisy['mask_logits'] = np.where(padded[..., None, None], np.nan, out['mask_logits'])
  noisy['mask_targets'] = np.where(padded[..., None, None], 1.0, out['mask_targets'])
  assert loss(noisy) == base
  # The mean runs over the positives' pixels only: the positive slots' own loss.
  logits, targets = out['mask_logits'][~padded], out['mask_targets'][~padded]
  bce = np.maximum(logits, 0) - logits * targets + np.log1p(np.exp(-np.abs(logits)))
  np.testing.assert_allclose(base, bce.mean(), rtol=1e-6)


@pytest.mark.parametrize(
  'overrides,canvas,masks',
  [
    ({}, (800, 1088), 32),
    ({'image_size': (800, 1344), 'content_size': (800, 1333), 'mask_rois': 128}, (800, 1344), 128),
  ],
)
def test_canvas_and_mask_slots_of_each_case(overrides, canvas, masks):
  cfg = mr.MASK_RCNN.resolve(overrides=overrides)
  trainer = mr.MASK_RCNN.trainer(cfg, precision.get('fp32'))
  batch = jax.eval_shape(lambda key: trainer.make_batch(key, 2), jax.random.key(0))
  assert batch['images'].shape == (2, *canvas, 3)
  module = nets.MaskRCNN(cfg)
  rngs = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}
  variables = jax.eval_shape(lambda b: module.init(rngs, b, False), batch)
  out = jax.eval_shape(
    lambda v, b: module.apply(v, b, False, rngs={'dropout': jax.random.key(2)}), variables, batch
  )
  assert out['mask_logits'].shape == out['mask_targets'].shape == (2, masks, 28, 28)
  assert out['rois'].shape == (2, 512, 4)


def test_mask_rois_bounded_by_the_sampled_positives():
  with pytest.raises(ValueError, match='mask_rois must be at most'):
    mr.MASK_RCNN.resolve(overrides={'mask_rois': 129})


def test_an_image_samples_rois_only_from_its_share():
  n, g = TINY['post_nms_top_n'], TINY['max_instances']
  image = jax.tree.map(
    lambda x: x[0], jax.jit(lambda k: mask_rcnn_data.make_batch(TINY, k, 1))(jax.random.key(4))
  )
  proposals = jnp.asarray(_random_boxes(np.random.default_rng(3), n, 60))
  share = jnp.arange(n) < 5  # the batch's top proposals left this image five
  roi = jax.jit(
    lambda v: mask_rcnn_targets.roi_targets(
      TINY,
      jax.random.uniform(jax.random.key(0), (n + g,)),
      proposals,
      v,
      image['gt_boxes'],
      image['gt_classes'],
      image['gt_masks'],
      image['gt_valid'],
    )
  )(share)
  allowed = np.concatenate(
    [np.asarray(proposals)[:5], np.asarray(image['gt_boxes'])[np.asarray(image['gt_valid'])]]
  )
  sampled = np.asarray(roi['rois'])[np.asarray(roi['roi_valid'])]
  assert 0 < len(sampled) <= len(allowed)
  for box in sampled:
    assert np.any(np.all(box == allowed, axis=1)), box
