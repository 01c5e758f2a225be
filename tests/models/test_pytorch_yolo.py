"""The PyTorch peer of yolov3 trains what the JAX workload trains: the same parameter count,
batch, network, targets, loss and learning-rate schedule, and it learns on a fixed batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from models import registry
from models import workload as wl
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry
from models.pytorch import yolo
from models.yolo import targets as jax_targets
from models.yolo import yolo as jax_yolo
from tests import shapes

NAME = 'yolov3'
CPU = torch.device('cpu')


pytestmark = pytest.mark.usefixtures('torch_one_thread')


@pytest.mark.parametrize('tiny', [False, True])
def test_parameter_count_equals_jax(tiny):
  cfg = registry.get(NAME).resolve(tiny=tiny)
  setup = peer_registry.get(NAME).build(cfg, torch.device('meta'))
  assert setup.param_count() == wl.count_params(shapes.state(NAME, cfg).params)
  if not tiny:
    assert setup.param_count() == 61_949_149


def test_batch_has_the_jax_shapes_dtypes_and_ranges():
  cfg = registry.get(NAME).resolve(tiny=True)
  jax_batch = jax.eval_shape(lambda k: jax_yolo.make_batch(cfg, k, 64), jax.random.key(0))
  batch = yolo.make_batch(cfg, 64, torch.Generator().manual_seed(0), CPU)
  assert set(batch) == set(jax_batch)
  for key, value in batch.items():
    want = jax_batch[key].shape
    if key == 'images':  # NCHW against NHWC
      want = (want[0], want[3], want[1], want[2])
    assert tuple(value.shape) == want, key
    assert str(value.dtype).removeprefix('torch.') == str(jax_batch[key].dtype), key
  valid, boxes = batch['valid'], batch['boxes']
  counts = valid.sum(1)
  assert 1 <= int(counts.min()) and int(counts.max()) <= cfg['max_boxes'] // 2
  assert (valid[:, 1:] <= valid[:, :-1]).all()  # the valid boxes come first
  real = boxes[valid]
  assert (real[:, 2:] >= 0.02 - 1e-6).all() and (real[:, 2:] <= 0.8 + 1e-6).all()
  assert (real[:, :2] - real[:, 2:] / 2 >= -1e-6).all()
  assert (real[:, :2] + real[:, 2:] / 2 <= 1 + 1e-6).all()
  assert (boxes[~valid] == 0).all() and (batch['classes'][~valid] == 0).all()
  assert 0 <= int(batch['classes'].min()) and int(batch['classes'].max()) < cfg['classes']
  assert 0 <= float(batch['images'].min()) and float(batch['images'].max()) < 1


def _outputs(cfg, n, seed):
  """Random raw outputs per scale, (B, G, G, 3, 5 + classes), coarsest first."""
  rng = np.random.default_rng(seed)
  grids = [cfg['image'] // stride for stride in (32, 16, 8)]
  return [rng.normal(size=(n, g, g, 3, 5 + cfg['classes'])).astype(np.float32) for g in grids]


def test_loss_equals_the_jax_loss():
  cfg = registry.get(NAME).resolve(tiny=True)
  n = 4
  batch = yolo.make_batch(cfg, n, torch.Generator().manual_seed(3), CPU)
  # Two boxes on one cell and anchor (the later wins), and a truth equal to a decoded
  # prediction, so that the ignore mask has work to do.
  batch['boxes'][0, 1] = batch['boxes'][0, 0] + torch.tensor([0.001, 0.001, 0.0, 0.0])
  batch['classes'][0, 1] = (batch['classes'][0, 0] + 1) % cfg['classes']
  batch['valid'][0, :2] = True
  outputs = _outputs(cfg, n, 0)
  anchors = torch.tensor(cfg['anchors'], dtype=torch.float32) / cfg['image']
  decoded = yolo.decode_boxes(torch.from_numpy(outputs[1]), anchors[list(yolo.ANCHOR_MASKS[1])])
  batch['boxes'][1, 0] = decoded[1, 2, 3, 0]
  batch['valid'][1, 0] = True
  thresh = yolo.ignore_thresh(cfg)
  assert thresh == jax_targets.IGNORE_THRESH
  ignored = yolo.ignore_mask(
    torch.from_numpy(outputs[1]), anchors[[3, 4, 5]], batch['boxes'], batch['valid'], thresh
  )
  assert ignored[1, 2, 3, 0] == 1

  torch_outputs = [torch.from_numpy(o).requires_grad_() for o in outputs]
  got, got_terms = yolo.yolo_loss(
    torch_outputs,
    batch['boxes'],
    batch['classes'],
    batch['valid'],
    anchors,
    yolo.ANCHOR_MASKS,
    thresh,
  )
  got.backward()
  jax_batch = {k: jnp.asarray(v.numpy()) for k, v in batch.items()}
  loss_fn = lambda outs: jax_yolo.loss(cfg, outs, jax_batch)
  (want, want_terms), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
    [jnp.asarray(o) for o in outputs]
  )
  np.testing.assert_allclose(got.item(), float(want), rtol=1e-5)
  for key, value in want_terms.items():
    np.testing.assert_allclose(got_terms[key].item(), float(value), rtol=1e-5, atol=1e-6)
  for o, g in zip(torch_outputs, grads):
    np.testing.assert_allclose(o.grad.numpy(), np.asarray(g), rtol=1e-5, atol=1e-6)


def _jax_variables(model):
  """The peer's weights and batch-norm statistics under the JAX module's names."""
  t = lambda x: jnp.asarray(x.detach().numpy())
  kernel = lambda conv: t(conv.weight.permute(2, 3, 1, 0))  # OIHW -> HWIO

  def block(b):
    conv, bn = b[0], b[1]
    params = {'conv': {'kernel': kernel(conv)}, 'bn': {'scale': t(bn.weight), 'bias': t(bn.bias)}}
    stats = {'bn': {'mean': t(bn.running_mean), 'var': t(bn.running_var)}}
    return params, stats

  blocks = {'darknet53/stem': model.darknet53.stem}
  for i, down in enumerate(model.darknet53.downs):
    blocks[f'darknet53/down{i}'] = down
    for j, residual in enumerate(model.darknet53.stages[i]):
      blocks[f'darknet53/stage{i}_{j}_a'] = residual[0]
      blocks[f'darknet53/stage{i}_{j}_b'] = residual[1]
  for s in range(3):
    if s:
      blocks[f'route{s}'] = model.routes[s - 1]
    for i, b in enumerate(model.heads[s]):
      blocks[f'head{s}_{i}'] = b
    blocks[f'head{s}_5'] = model.outs[s]
  params, stats = {}, {}
  for path, b in blocks.items():
    p, st = block(b)
    *outer, name = path.split('/')
    for tree, value in ((params, p), (stats, st)):
      node = tree
      for key in outer:
        node = node.setdefault(key, {})
      node[name] = value
  for s, detect in enumerate(model.detects):
    params[f'detect{s}'] = {'kernel': kernel(detect), 'bias': t(detect.bias)}
  return params, stats


def test_network_equals_the_jax_network_on_the_same_weights():
  torch.manual_seed(0)
  cfg = registry.get(NAME).resolve(tiny=True)
  model = yolo.YOLOv3(cfg)
  with torch.no_grad():  # nonzero biases and statistics: every weight matters
    for m in model.modules():
      if isinstance(m, torch.nn.BatchNorm2d):
        m.weight.uniform_(0.5, 1.5)
        m.bias.normal_(0, 0.1)
        m.running_mean.normal_(0, 0.1)
        m.running_var.uniform_(0.5, 1.5)
    for detect in model.detects:
      detect.bias.normal_()
  model.eval()
  batch = yolo.make_batch(cfg, 2, torch.Generator().manual_seed(0), CPU)
  with torch.no_grad():
    got = model(batch['images'])
  params, stats = _jax_variables(model)
  state = shapes.state(NAME, cfg)
  assert jax.tree.structure(params) == jax.tree.structure(state.params)
  assert jax.tree.structure(stats) == jax.tree.structure(state.model_state['batch_stats'])
  images = jnp.asarray(batch['images'].permute(0, 2, 3, 1).numpy())
  want = jax_yolo.YOLOv3(cfg).apply(
    {'params': params, 'batch_stats': stats}, {'images': images}, train=False
  )
  assert len(got) == len(want) == 3
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.numpy(), np.asarray(w), rtol=1e-4, atol=1e-4)


def test_learning_rate_follows_the_jax_schedule():
  cfg = dict(registry.get(NAME).resolve(tiny=True), burn_in=3, lr_steps=(5, 7))
  setup = yolo.build(cfg, CPU)
  optimizer = setup.updates[0].optimizer
  want = jax_yolo.darknet_schedule(cfg)
  decay = {id(p) for g in optimizer.param_groups if g['weight_decay'] for p in g['params']}
  kernels = {id(p) for n, p in setup.modules['yolov3'].named_parameters() if n.endswith('weight')}
  kernels -= {
    id(m.weight) for m in setup.modules['yolov3'].modules() if isinstance(m, torch.nn.BatchNorm2d)
  }
  assert decay == kernels  # convolution kernels only, as the JAX mask
  for step in range(9):
    for group in optimizer.param_groups:
      np.testing.assert_allclose(group['lr'], float(want(step)), rtol=1e-6)
    optimizer.step()  # no gradients: moves nothing, keeps the scheduler's order
    setup.after_step()


def test_one_iteration_then_the_loss_falls_on_a_fixed_batch():
  torch.manual_seed(0)
  cfg = registry.get(NAME).resolve(tiny=True)
  setup = peer_registry.get(NAME).build(cfg, CPU)
  assert set(setup.modules) == {'yolov3'}
  batch = yolo.make_batch(cfg, 4, torch.Generator().manual_seed(1), CPU)
  losses = [peer_lib.run_updates(setup, batch, step).item() for step in range(12)]
  assert np.isfinite(losses).all()
  assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses
