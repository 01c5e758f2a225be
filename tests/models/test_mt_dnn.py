"""MT-DNN: the reference's parameter count, the task cycle, the SAN and STS-B heads, Adamax."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models import precision
from models import workload as wl
from models.layers import attention
from models.mt_dnn import mt_dnn
from tests import tiny as shared


def _reference_params(vocab=30522, h=1024, layers=24, ffn=4096, positions=512, types=2):
  """namisan/mt-dnn's SANBertNetwork over the 8 GLUE tasks, from its PyTorch layer shapes."""
  embeddings = (vocab + positions + types) * h + 2 * h
  layer = 4 * (h * h + h) + 2 * h + (h * ffn + ffn) + (ffn * h + h) + 2 * h
  encoder = embeddings + layers * layer + (h * h + h)  # + BertModel's pooler
  # SANClassifier: LinearSelfAttn Linear(h, 1), BilinearFlatSim Linear(h, h),
  # GRUCell(h, h) (two 3h x h matrices, two 3h biases), Classifier Linear(4h, classes).
  san = lambda classes: (
    (h + 1) + (h * h + h) + 2 * (3 * h * h + 3 * h) + (4 * h * classes + classes)
  )
  pooled = lambda classes: h * classes + classes  # nn.Linear(h, classes) on the pooled output
  heads = san(3) + 4 * san(2) + 2 * pooled(2) + pooled(1)  # MNLI; RTE..MRPC; SST, CoLA; STS-B
  return encoder, encoder + heads


@pytest.mark.slow
def test_param_count_matches_reference():
  w = mt_dnn.MT_DNN
  trainer = w.trainer(w.resolve(), precision.get('fp32'))
  counts = wl.param_counts(trainer, jax.eval_shape(trainer.init, jax.random.key(0)))
  encoder, total = _reference_params()
  assert counts['encoder'] == encoder  # BERT-large with its pooler
  assert counts['total'] == total


def _tiny():
  cfg = mt_dnn.MT_DNN.resolve(tiny=True)
  return cfg, mt_dnn.MT_DNN.trainer(cfg, precision.get('fp32'))


@pytest.mark.slow
def test_one_cycle_updates_every_head_and_reports_every_task():
  rng = jax.random.key(0)
  state, batch = shared.start('mt_dnn')
  new_state, metrics = shared.tiny('mt_dnn').step(state, batch, rng)
  assert int(new_state.step) == 1
  for task in mt_dnn.TASKS:
    old, new = state.params[f'heads_{task.name}'], new_state.params[f'heads_{task.name}']
    # The reference's nn.Linear(H, 1) bias adds one number to every score of a softmax, which
    # the softmax does not see: its gradient is zero but for rounding, and Adam may or may not
    # move it. Every other parameter of the head has a gradient of its own.
    old, new = ({k: v for k, v in p.items() if k != 'query_bias'} for p in (old, new))
    changed = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), old, new)
    assert all(jax.tree.leaves(changed)), (task.name, changed)
    assert np.isfinite(float(metrics[f'{task.name}_loss']))
  losses = [float(metrics[f'{t.name}_loss']) for t in mt_dnn.TASKS]
  np.testing.assert_allclose(float(metrics['loss']), np.mean(losses), rtol=1e-6)


def test_stsb_head_is_regression_and_others_classify():
  cfg, _ = _tiny()
  model = mt_dnn.MtDnn(cfg)
  batches = jax.jit(lambda rng: mt_dnn.make_batch(cfg, rng, 3))(jax.random.key(1))
  params = jax.jit(lambda rng: model.init(rng, batches['stsb'], train=False))(jax.random.key(0))
  outputs = jax.jit(lambda p: model.apply(p, batches['stsb'], train=False))(params)
  stsb = batches['stsb']['labels']
  assert stsb.dtype == jnp.float32 and outputs['stsb'].shape == (3,)
  index = [t.name for t in mt_dnn.TASKS].index('stsb')
  np.testing.assert_allclose(
    float(mt_dnn.task_loss(index, outputs['stsb'], stsb)),
    np.mean((np.asarray(outputs['stsb']) - np.asarray(stsb)) ** 2),
    rtol=1e-6,
  )
  for task in mt_dnn.TASKS:
    if task.name != 'stsb':
      assert outputs[task.name].shape == (3, task.classes)
      assert batches[task.name]['labels'].dtype == jnp.int32
  # SAN returns log-probabilities averaged over the turns (all kept outside training).
  np.testing.assert_allclose(np.exp(np.asarray(outputs['mnli'])).sum(-1), 1.0, rtol=1e-5)


def test_san_reads_the_first_segment_then_the_second_and_ignores_padding():
  cfg, _ = _tiny()
  h, length = cfg['hidden'], 10
  san = mt_dnn.SanClassifier(classes=2, dropout=0.1, turns=3)
  hidden = jax.random.normal(jax.random.key(0), (2, length, h))
  positions = jnp.arange(length)[None].repeat(2, 0)
  first, second = positions < 4, (positions >= 4) & (positions < 8)  # 8, 9: padding
  params = san.init(jax.random.key(1), hidden, first, second, False)
  run = jax.jit(lambda x: san.apply(params, x, first, second, False))
  base = np.asarray(run(hidden))
  np.testing.assert_allclose(run(hidden.at[:, 9].set(5.0)), base, rtol=1e-6)
  assert not np.allclose(run(hidden.at[:, 1].set(5.0)), base)  # the query's segment
  assert not np.allclose(run(hidden.at[:, 6].set(5.0)), base)  # the memory


def test_adamax_matches_mt_dnn_update():
  # 10 updates, warm-up 0.2: pytorch-pretrained-bert's warmup_linear gives these lr factors.
  cfg = dict(mt_dnn.MT_DNN.config, lr=0.1, warmup=0.2, total_steps=10)
  factors = [0.0, 0.5, 1.0, 0.875]
  tx = mt_dnn.optimizer(cfg)
  params = {'w': jnp.array([1.0, -2.0])}
  state = tx.init(params)
  m = u = np.zeros(2)
  p = np.array([1.0, -2.0])
  for factor, g in zip(factors, ([0.5, -0.1], [-0.2, 0.3], [3.0, 4.0], [0.1, 0.1])):
    updates, state = tx.update({'w': jnp.array(g)}, state, params)
    params = optax.apply_updates(params, updates)
    # Global norm clip 1; module/bert_optim.py: no bias correction, infinity norm,
    # decoupled weight decay 0.01.
    g = np.array(g) / max(1.0, np.linalg.norm(g))
    m = 0.9 * m + 0.1 * g
    u = np.maximum(0.999 * u, np.abs(g) + 1e-6)
    p = p - 0.1 * factor * (m / (u + 1e-6) + 0.01 * p)
    np.testing.assert_allclose(np.asarray(params['w']), p, rtol=1e-5)


def test_encoder_drops_attention_probabilities_per_sequence_and_head():
  """MT-DNN's BERT drops [B, N, L, L] attention probabilities (test_attention.py tests masks)."""
  cfg, _ = _tiny()
  model = mt_dnn.MtDnn(cfg)
  batch = mt_dnn.make_batch(cfg, jax.random.key(1), 2)['mnli']
  seen = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, attention.MultiHead) and context.method_name == '__call__':
      seen.append((context.module.broadcast_dropout, context.module.dropout_rate))
    return next_fun(*args, **kwargs)

  params = model.init(jax.random.key(0), batch, train=False)
  with nn.intercept_methods(record):
    model.apply(
      params,
      batch['tokens'],
      batch['segments'],
      True,
      method=mt_dnn.MtDnn.encode,
      rngs={'dropout': jax.random.key(2)},
    )
  assert seen == [(False, cfg['dropout'])] * cfg['layers']
