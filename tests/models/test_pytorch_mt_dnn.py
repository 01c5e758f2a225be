"""The PyTorch peer of mt_dnn: one update per task, the JAX batch and parameter counts, and
MT-DNN's Adamax as the JAX workload's optax chain."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from models import precision, registry
from models import workload as wl
from models.mt_dnn import mt_dnn as mt_dnn_jax
from models.mt_dnn.adamax import scale_by_mtdnn_adamax
from models.pytorch import mt_dnn
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry
from tests.models.test_pytorch_bert import load, load_encoder, perturbed

CPU = torch.device('cpu')


pytestmark = pytest.mark.usefixtures('torch_one_thread')


def _tiny(n=4):
  torch.manual_seed(0)
  cfg = registry.get('mt_dnn').resolve(tiny=True)
  peer = peer_registry.get('mt_dnn')
  return cfg, peer, peer.make_batch(cfg, n, torch.Generator(CPU).manual_seed(1), CPU)


def test_one_update_per_task_in_the_jax_order_and_every_head_trains():
  cfg, peer, batch = _tiny()
  setup = peer.build(cfg, CPU)
  assert len(setup.updates) == len(mt_dnn_jax.TASKS)
  assert all(u.clip_norm == cfg['clip'] for u in setup.updates)
  # Each update's loss reads its own task's batch only.
  for task, update in zip(mt_dnn_jax.TASKS, setup.updates):
    loss = update.loss({task.name: batch[task.name]}, 0)
    assert loss.shape == () and bool(torch.isfinite(loss))
  heads = setup.modules['heads']
  before = {k: v.detach().clone() for k, v in heads.state_dict().items()}
  peer_lib.run_updates(setup, batch, 0)
  peer_lib.run_updates(setup, batch, 1)  # the schedule's first update has learning rate 0
  after = heads.state_dict()
  unchanged = [k for k in before if torch.equal(before[k], after[k])]
  assert not unchanged


def test_task_losses_are_finite_and_fall_on_a_fixed_batch():
  cfg, peer, batch = _tiny()
  setup = peer.build(cfg, CPU)

  def task_losses():
    with torch.no_grad():
      setup.modules['encoder'].eval(), setup.modules['heads'].eval()
      losses = [float(u.loss(batch, 0)) for u in setup.updates]
      setup.modules['encoder'].train(), setup.modules['heads'].train()
    return np.array(losses)

  first = task_losses()
  for step in range(8):
    assert np.isfinite(float(peer_lib.run_updates(setup, batch, step)))
  last = task_losses()
  assert np.all(np.isfinite(last)) and last.sum() < first.sum(), (first, last)


def test_batch_has_the_jax_batch_shapes_and_dtypes():
  cfg, _, batch = _tiny(n=3)
  trainer = registry.get('mt_dnn').trainer(cfg, precision.get('fp32'))
  expected = jax.eval_shape(lambda: trainer.make_batch(jax.random.key(0), 3))
  got = {
    task: {k: (tuple(v.shape), str(v.dtype).removeprefix('torch.')) for k, v in b.items()}
    for task, b in batch.items()
  }
  assert got == {
    task: {k: (v.shape, str(v.dtype)) for k, v in b.items()} for task, b in expected.items()
  }


def test_pair_tasks_have_two_nonempty_segments_and_stsb_scores_in_range():
  cfg, _, batch = _tiny(n=64)
  for task in mt_dnn_jax.TASKS:
    segments = batch[task.name]['segments']
    second = segments.sum(1)
    if task.pair:
      assert bool((second >= 1).all()) and bool((second < cfg['seq_len']).all())
    else:
      assert int(second.max()) == 0
  scores = batch['stsb']['labels']
  assert 0 <= float(scores.min()) and float(scores.max()) <= 5
  assert int(batch['mnli']['labels'].max()) == 2


def test_full_size_param_counts_are_the_jax_counts():
  w = registry.get('mt_dnn')
  cfg = w.resolve()
  trainer = w.trainer(cfg, precision.get('fp32'))
  jax_counts = wl.param_counts(trainer, jax.eval_shape(trainer.init, jax.random.key(0)))
  setup = peer_registry.get('mt_dnn').build(cfg, torch.device('meta'))
  counts = {name: sum(p.numel() for p in m.parameters()) for name, m in setup.modules.items()}
  assert {'total': setup.param_count(), **counts} == jax_counts


def test_adamax_is_the_jax_workloads_optimizer_after_clipping():
  """No bias correction, u = max(b2 u, |g| + eps), decay on every parameter, the schedule; a
  parameter without a gradient steps as the JAX one with a zero gradient."""
  lr, warmup, total = 1e-2, 2, 6
  rng = np.random.default_rng(0)
  values = [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32)]
  torch_params = [torch.nn.Parameter(torch.tensor(v)) for v in values]
  optimizer = mt_dnn.MtDnnAdamax(torch_params, mt_dnn.bert_peer.warmup_linear(lr, warmup, total))
  schedule = optax.join_schedules(
    [optax.linear_schedule(0.0, lr, warmup), optax.linear_schedule(lr, 0.0, total - warmup)],
    [warmup],
  )
  tx = optax.chain(
    scale_by_mtdnn_adamax(), optax.add_decayed_weights(0.01), optax.scale_by_learning_rate(schedule)
  )
  params = [jnp.asarray(v) for v in values]
  opt_state = tx.init(params)
  for step in range(5):
    grads = [rng.normal(size=v.shape).astype(np.float32) for v in values]
    if step in (2, 3):  # the second parameter's task does not run
      grads[1] = np.zeros_like(grads[1])
    for p, g in zip(torch_params, grads):
      p.grad = None if step in (2, 3) and p is torch_params[1] else torch.tensor(g)
    optimizer.step()
    updates, opt_state = tx.update([jnp.asarray(g) for g in grads], opt_state, params)
    params = optax.apply_updates(params, updates)
  for p, expected in zip(torch_params, params):
    # Five float32 updates of about lr (1e-2) each.
    np.testing.assert_allclose(p.detach().numpy(), np.asarray(expected), rtol=1e-5, atol=1e-6)


def _dense(name, p):
  return {f'{name}.weight': p['kernel'].T, f'{name}.bias': p['bias']}


@pytest.mark.slow
def test_task_losses_are_the_jax_losses_at_the_same_weights():
  """Without dropout, at the JAX model's (perturbed) weights: the same encoder, pooler, SAN
  answer modules (attention, turns, GRU, averaged probabilities) and pooled heads."""
  cfg, peer, batch = _tiny()
  module = mt_dnn_jax.MtDnn(cfg)
  jax_batch = {t: {k: jnp.asarray(v.numpy()) for k, v in b.items()} for t, b in batch.items()}
  init = jax.jit(lambda rng: module.init(rng, jax_batch['mnli'], train=False)['params'])
  params = perturbed(init(jax.random.key(0)))
  setup = peer.build(cfg, CPU)
  load_encoder(setup.modules['encoder'], params['bert'], params['pooler'])
  for task in mt_dnn_jax.TASKS:
    p = params[f'heads_{task.name}']
    if task.head == 'san':
      turn = p['turn']
      sources = {
        'query.weight': p['query_kernel'][None],
        'query.bias': p['query_bias'][None],
        **_dense('bilinear', turn['bilinear']),
        **_dense('classifier', turn['classifier']),
        'gru.weight_ih': turn['gru']['input']['kernel'].T,
        'gru.bias_ih': turn['gru']['input']['bias'],
        'gru.weight_hh': turn['gru']['hidden']['kernel'].T,
        'gru.bias_hh': turn['gru']['hidden']['bias'],
      }
    else:
      sources = _dense('dense', p['dense'])
    load(setup.modules['heads'][task.name], sources)
  for m in setup.modules.values():
    m.eval()
  apply = jax.jit(lambda b: module.apply({'params': params}, b, train=False))  # every head
  for i, (task, update) in enumerate(zip(mt_dnn_jax.TASKS, setup.updates)):
    outputs = apply(jax_batch[task.name])[task.name]
    expected = float(mt_dnn_jax.task_loss(i, outputs, jax_batch[task.name]['labels']))
    with torch.no_grad():
      got = float(update.loss(batch, 0))
    np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=task.name)
