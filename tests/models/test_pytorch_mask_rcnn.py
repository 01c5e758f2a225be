"""The PyTorch peer of mask_rcnn: torchvision's MaskRCNN on ResNet-101-FPN with the JAX workload's
parameters (frozen ones included), data, frozen statistics and optimizer, and it learns."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torchvision.models.detection import backbone_utils
from torchvision.ops import FrozenBatchNorm2d

from models import registry
from models import workload as wl
from models.mask_rcnn import data as jax_data
from models.mask_rcnn import mask_rcnn as jax_mask_rcnn
from models.pytorch import mask_rcnn
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry
from tests import shapes

NAME = 'mask_rcnn'
CPU = torch.device('cpu')
META = torch.device('meta')


pytestmark = pytest.mark.usefixtures('torch_one_thread')


def _counts(cfg):
  """(JAX, peer) parameter counts per part: body (frozen stages apart), FPN, RPN, heads."""
  params = shapes.state(NAME, cfg).params
  backbone = dict(params['backbone'])
  fpn = backbone.pop('fpn')
  frozen = [k for k in backbone if k.split('_')[0] in ('stem', 'res2')]
  want = {
    'frozen': sum(wl.count_params(backbone.pop(k)) for k in frozen),
    'body': wl.count_params(backbone),
    'fpn': wl.count_params(fpn),
    'rpn': wl.count_params(params['rpn']),
    'box_head': wl.count_params(params['box_head']),
    'mask_head': wl.count_params(params['mask_head']),
  }
  net = mask_rcnn.build(cfg, META).modules['mask_rcnn']
  count = lambda m, trained=True: sum(
    p.numel() for p in m.parameters() if p.requires_grad == trained
  )
  got = {
    'frozen': count(net.backbone.body, trained=False),
    'body': count(net.backbone.body),
    'fpn': count(net.backbone.fpn),
    'rpn': count(net.rpn),
    'box_head': count(net.roi_heads.box_head) + count(net.roi_heads.box_predictor),
    'mask_head': count(net.roi_heads.mask_head) + count(net.roi_heads.mask_predictor),
  }
  return want, got


def test_full_size_parameter_count_equals_jax_part_by_part():
  """Frozen batch norm's statistics are buffers in torchvision and a separate collection in JAX:
  neither counts them. The frozen stem and res2 weights are parameters in both."""
  cfg = registry.get(NAME).resolve()
  want, got = _counts(cfg)
  assert got == want
  assert want['frozen'] == 222_400
  setup = peer_registry.get(NAME).build(cfg, META)
  assert setup.param_count() == sum(want.values()) == 63_287_477


def test_tiny_parameter_count_equals_jax_part_by_part():
  want, got = _counts(registry.get(NAME).resolve(tiny=True))
  assert got == want


def test_full_size_body_is_resnet_fpn_backbone_and_the_general_one_builds_the_same():
  cfg = registry.get(NAME).resolve()
  with torch.device(META):
    reference = backbone_utils.resnet_fpn_backbone(
      backbone_name='resnet101', weights=None, trainable_layers=3, norm_layer=FrozenBatchNorm2d
    )
    general = mask_rcnn.backbone(dict(cfg, blocks=(3, 4, 23, 2)))
    general.body.layer4.add_module('2', reference.body.layer4[2])
    full = mask_rcnn.backbone(cfg)
  torch_shapes = lambda m: {k: (tuple(v.shape), v.requires_grad) for k, v in m.named_parameters()}
  assert type(full) is type(reference) and torch_shapes(full) == torch_shapes(reference)
  assert type(full.body.layer1[0].bn1) is FrozenBatchNorm2d
  # The general construction (tiny presets) at R-101's sizes is the same network.
  assert torch_shapes(general) == torch_shapes(reference)
  buffers = lambda m: {k: tuple(v.shape) for k, v in m.named_buffers()}
  assert buffers(general) == buffers(reference)


def test_drawn_batch_has_the_jax_shapes_and_dtypes():
  cfg = registry.get(NAME).resolve(tiny=True)
  want = jax.eval_shape(lambda r: jax_data.make_batch(cfg, r, 3), jax.random.key(0))
  drawn = mask_rcnn.draw(cfg, 3, torch.Generator().manual_seed(0), CPU)
  assert set(drawn) == set(want) | {'gt_exponent'}
  n, h, w, c = want['images'].shape
  assert tuple(drawn['images'].shape) == (n, c, h, w)  # NCHW
  for key in want:
    if key != 'images':
      assert tuple(drawn[key].shape) == want[key].shape, key
    assert str(drawn[key].dtype).removeprefix('torch.') == str(want[key].dtype), key


def test_targets_hold_the_valid_instances_and_their_masks():
  cfg = registry.get(NAME).resolve(tiny=True)
  batch = mask_rcnn.make_batch(cfg, 8, torch.Generator().manual_seed(0), CPU)
  height, width = cfg['content_size']
  assert len(batch['targets']) == 8
  counts = batch['gt_valid'].sum(dim=1)
  assert 1 <= int(counts.min()) and int(counts.max()) <= cfg['max_real_instances']
  assert batch['gt_valid'][:, cfg['max_real_instances'] :].sum() == 0
  coverage = []
  for b, target in enumerate(batch['targets']):
    k = int(counts[b])
    assert torch.equal(target['boxes'], batch['gt_boxes'][b, :k])
    assert torch.equal(target['labels'], batch['gt_classes'][b, :k].long())
    assert target['labels'].dtype == torch.int64 and target['masks'].dtype == torch.uint8
    assert tuple(target['masks'].shape) == (k, height, width)
    assert (1 <= target['labels']).all() and (target['labels'] < cfg['num_classes']).all()
    boxes = target['boxes']
    assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] < width).all() and (boxes[:, 3] < height).all()
    for i in range(k):
      x1, y1, x2, y2 = boxes[i].tolist()
      mask = target['masks'][i]
      ys, xs = torch.nonzero(mask, as_tuple=True)
      # Every mask pixel's centre lies in its box.
      assert xs.min() + 0.5 >= x1 and xs.max() + 0.5 <= x2 + 1
      assert ys.min() + 0.5 >= y1 and ys.max() + 0.5 <= y2 + 1
      area = (x2 - x1 + 1) * (y2 - y1 + 1)
      coverage.append((mask.sum().item() / area, batch['gt_masks'][b, i].float().mean().item()))
  # The whole-image mask covers as much of its box as the box-grid mask (the JAX form) does.
  whole, grid = np.array(coverage).T
  np.testing.assert_allclose(whole, grid, atol=0.12)
  # The padding right of the content is zero, the content is not.
  images = batch['images']
  assert (images[..., width:] == 0).all() and (images[..., :width] != 0).float().mean() > 0.99


def test_frozen_statistics_normalize_the_sample_as_jax_does():
  cfg = registry.get(NAME).resolve(tiny=True)
  setup = mask_rcnn.build(cfg, CPU)
  body = setup.modules['mask_rcnn'].backbone.body
  sample = mask_rcnn.draw(cfg, cfg['frozen_bn_images'], torch.Generator().manual_seed(0), CPU)
  seen = {}

  def keep(module, args, out):
    seen['stem'] = out.clone()  # a copy: the stem's ReLU overwrites the output in place

  hook = body.bn1.register_forward_hook(keep)
  with torch.no_grad():
    body(sample['images'])
  hook.remove()
  stem = seen['stem']
  np.testing.assert_allclose(stem.mean(dim=(0, 2, 3)), 0.0, atol=1e-4)
  np.testing.assert_allclose(stem.std(dim=(0, 2, 3), unbiased=False), 1.0, rtol=1e-3)
  for i, n in enumerate(cfg['blocks']):
    for block in getattr(body, f'layer{i + 1}'):
      assert torch.allclose(block.bn3.weight, torch.tensor(1 / math.sqrt(n)))
  # The stem and res2 are frozen: no gradient and no optimizer slot.
  frozen = [p for name, p in body.named_parameters() if name.startswith(('conv1', 'layer1'))]
  assert frozen and not any(p.requires_grad for p in frozen)
  optimized = {id(p) for g in setup.updates[0].optimizer.param_groups for p in g['params']}
  assert not optimized & {id(p) for p in frozen}


def test_learning_rates_and_decay_follow_the_jax_optimizer():
  """Weights at the warm-up schedule's rate with decay, biases at twice it without: read from
  the JAX optimizer's updates of unit gradients (momentum 0 here, so an update is the rate)."""
  cfg = dict(registry.get(NAME).resolve(tiny=True), warmup=3, lr_steps=(4, 6), momentum=0.0)
  tx = jax_mask_rcnn.optimizer(cfg)
  params = {'box_head': {'fc6': {'kernel': jnp.zeros(()), 'bias': jnp.zeros(())}}}
  grads = jax.tree.map(jnp.ones_like, params)
  opt_state = tx.init(params)
  setup = mask_rcnn.build(cfg, CPU)
  optimizer = setup.updates[0].optimizer
  weights, biases = optimizer.param_groups
  assert weights['weight_decay'] == cfg['weight_decay'] and biases['weight_decay'] == 0
  named = dict(setup.modules['mask_rcnn'].named_parameters())
  assert id(named['roi_heads.box_head.fc6.bias']) in {id(p) for p in biases['params']}
  assert id(named['roi_heads.box_head.fc6.weight']) in {id(p) for p in weights['params']}
  for _ in range(8):
    updates, opt_state = tx.update(grads, opt_state, params)
    fc6 = updates['box_head']['fc6']
    np.testing.assert_allclose(weights['lr'], -float(fc6['kernel']), rtol=1e-6)
    np.testing.assert_allclose(biases['lr'], -float(fc6['bias']), rtol=1e-6)
    optimizer.step()  # no gradients: changes nothing, but the schedule steps after it
    setup.after_step()


def test_one_iteration_then_the_loss_falls_on_a_fixed_batch():
  torch.manual_seed(0)
  cfg = registry.get(NAME).resolve(tiny=True)
  setup = peer_registry.get(NAME).build(cfg, CPU)
  assert set(setup.modules) == {'mask_rcnn'}
  batch = mask_rcnn.make_batch(cfg, 2, torch.Generator().manual_seed(1), CPU)
  losses = [peer_lib.run_updates(setup, batch, step).item() for step in range(15)]
  assert np.isfinite(losses).all()
  # The samplers draw anew each step: compare the means of the first and last five.
  assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses
