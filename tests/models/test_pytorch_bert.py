"""The PyTorch peers of bert_base and bert_squad: they train, their batches and parameter counts
are the JAX workloads', and their AdamW is models/bert.adamw."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from models import bert, precision, registry
from models import workload as wl
from models.pytorch import bert as bert_peer
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry

NAMES = ('bert_base', 'bert_squad')
CPU = torch.device('cpu')


@pytest.fixture(autouse=True, scope='module')
def one_thread():
  """Tiny models: a second intra-op thread only contends with the other test workers."""
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


def _tiny(name, n=4):
  torch.manual_seed(0)
  cfg = registry.get(name).resolve(tiny=True)
  peer = peer_registry.get(name)
  batch = peer.make_batch(cfg, n, torch.Generator(CPU).manual_seed(1), CPU)
  return cfg, peer, batch


@pytest.mark.parametrize('name', NAMES)
def test_loss_is_finite_and_falls_on_a_fixed_batch(name):
  cfg, peer, batch = _tiny(name)
  setup = peer.build(cfg, CPU)
  losses = [float(peer_lib.run_updates(setup, batch, step)) for step in range(6)]
  assert all(np.isfinite(losses)), losses
  assert losses[-1] < losses[0], losses


@pytest.mark.parametrize('name', NAMES)
def test_batch_has_the_jax_batch_shapes_and_dtypes(name):
  cfg, peer, batch = _tiny(name, n=3)
  trainer = registry.get(name).trainer(cfg, precision.get('fp32'))
  expected = jax.eval_shape(lambda: trainer.make_batch(jax.random.key(0), 3))
  got = {k: (tuple(v.shape), str(v.dtype).removeprefix('torch.')) for k, v in batch.items()}
  assert got == {k: (v.shape, str(v.dtype)) for k, v in expected.items()}


def test_masked_positions_are_distinct_and_never_cls():
  cfg, _, batch = _tiny('bert_base', n=64)
  positions = batch['masked_positions']
  assert int(positions.min()) >= 1 and int(positions.max()) < cfg['seq_len']
  assert all(len(set(row.tolist())) == cfg['masked'] for row in positions)
  assert 0 < float(batch['next_sentence'].float().mean()) < 1


def test_squad_spans_lie_in_the_context():
  cfg, _, batch = _tiny('bert_squad', n=256)
  start, end = batch['start_positions'], batch['end_positions']
  assert bool((start >= cfg['question_len']).all()) and bool((end <= cfg['seq_len'] - 2).all())
  assert bool((end >= start).all()) and bool((end - start < cfg['max_answer_len']).all())


@pytest.mark.parametrize('name', NAMES)
def test_full_size_param_count_is_the_jax_count(name):
  w = registry.get(name)
  cfg = w.resolve()
  trainer = w.trainer(cfg, precision.get('fp32'))
  jax_count = wl.param_counts(trainer, jax.eval_shape(trainer.init, jax.random.key(0)))['total']
  assert peer_registry.get(name).build(cfg, torch.device('meta')).param_count() == jax_count


def test_pretraining_heads_tie_the_decoder_to_the_word_embeddings():
  cfg, peer, _ = _tiny('bert_base')
  model = peer.build(cfg, torch.device('meta')).modules['bert']
  predictions = model.cls.predictions
  assert predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
  assert predictions.decoder.bias is predictions.bias


def test_adamw_is_the_jax_workloads_adamw():
  """Warm-up and decay, bias correction, eps, and weight decay on weights and embeddings only."""
  cfg = dict(lr=1e-2, warmup=2, total_steps=6)
  model = torch.nn.ModuleDict(
    {
      'embed': torch.nn.Embedding(5, 3),
      'dense': torch.nn.Linear(3, 4),
      'norm': torch.nn.LayerNorm(4),
    }
  )
  params = {
    'embed': {'embedding': model['embed'].weight},
    'dense': {'kernel': model['dense'].weight.T, 'bias': model['dense'].bias},
    'norm': {'scale': model['norm'].weight, 'bias': model['norm'].bias},
  }
  params = jax.tree.map(lambda t: jnp.asarray(t.detach().numpy()), params)
  tx = bert.adamw(cfg)
  opt_state = tx.init(params)
  optimizer = bert_peer.adamw(model, cfg, CPU)
  rng = np.random.default_rng(0)
  for _ in range(5):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    model['embed'].weight.grad = torch.tensor(np.asarray(grads['embed']['embedding']))
    model['dense'].weight.grad = torch.tensor(np.asarray(grads['dense']['kernel']).T.copy())
    model['dense'].bias.grad = torch.tensor(np.asarray(grads['dense']['bias']))
    model['norm'].weight.grad = torch.tensor(np.asarray(grads['norm']['scale']))
    model['norm'].bias.grad = torch.tensor(np.asarray(grads['norm']['bias']))
    optimizer.step()
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
  got = {
    'embed': {'embedding': model['embed'].weight},
    'dense': {'kernel': model['dense'].weight.T, 'bias': model['dense'].bias},
    'norm': {'scale': model['norm'].weight, 'bias': model['norm'].bias},
  }
  jax.tree.map(
    # Five float32 updates of about lr (1e-2) each; weight decay moves a weight by lr * 0.01 * w.
    lambda t, p: np.testing.assert_allclose(
      t.detach().numpy(), np.asarray(p), rtol=1e-5, atol=1e-6
    ),
    got,
    params,
  )
