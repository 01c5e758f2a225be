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


pytestmark = pytest.mark.usefixtures('torch_one_thread')


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


def _tensor(x, transpose=False):
  x = np.asarray(x, np.float32)
  return torch.tensor(x.T.copy() if transpose else x)


def load_encoder(model, bert_params, pooler_params=None):
  """Copies models/bert.BertEncoder's parameters (and the Pooler's) into a BertModel."""
  h = model.config.hidden_size
  sources = {
    'embeddings.word_embeddings.weight': bert_params['word_embeddings']['embedding'],
    'embeddings.position_embeddings.weight': bert_params['position_embeddings'],
    'embeddings.token_type_embeddings.weight': bert_params['token_type_embeddings']['embedding'],
    'embeddings.LayerNorm.weight': bert_params['embeddings_norm']['scale'],
    'embeddings.LayerNorm.bias': bert_params['embeddings_norm']['bias'],
  }
  dense = lambda name, p: {f'{name}.weight': p['kernel'].reshape(-1, p['kernel'].shape[-1]).T}
  for i in range(model.config.num_hidden_layers):
    layer, to = bert_params[f'layer_{i}'], f'encoder.layer.{i}.'
    attention = layer['self_attention']
    for name in ('query', 'key', 'value'):
      sources[f'{to}attention.self.{name}.weight'] = attention[name]['kernel'].reshape(h, h).T
      sources[f'{to}attention.self.{name}.bias'] = attention[name]['bias'].reshape(h)
    for name, p in (
      ('attention.output.dense', attention['out']),
      ('intermediate.dense', layer['ffn']['fc1']),
      ('output.dense', layer['ffn']['fc2']),
    ):
      sources.update(dense(to + name, p))
      sources[f'{to}{name}.bias'] = p['bias']
    for name, norm in (
      ('attention.output.LayerNorm', 'self_attention_norm'),
      ('output.LayerNorm', 'ffn_norm'),
    ):
      sources[f'{to}{name}.weight'] = layer[norm]['scale']
      sources[f'{to}{name}.bias'] = layer[norm]['bias']
  if pooler_params is not None:
    sources['pooler.dense.weight'] = pooler_params['Dense_0']['kernel'].T
    sources['pooler.dense.bias'] = pooler_params['Dense_0']['bias']
  load(model, sources)


def load(module, sources):
  """Sets every parameter of `module` from `sources` (name -> array); all must be given."""
  params = dict(module.named_parameters())
  assert set(sources) == set(params), set(params) ^ set(sources)
  with torch.no_grad():
    for name, value in sources.items():
      params[name].copy_(_tensor(value))


def perturbed(params, scale=0.3):
  """The parameters plus N(0, scale^2) noise: activations of order one, where the forms of GELU
  and LayerNorm differ, rather than the near-zero ones of BERT's N(0, 0.02) initialization."""
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda p: p + scale * rng.standard_normal(p.shape).astype(np.float32), params)


def assert_same_hidden_states(cfg, bert_params, model, batch):
  """The encoder's last hidden states (LayerNorm outputs, of order one) agree to float32."""
  tokens, segments = (jnp.asarray(batch[k].numpy()) for k in ('tokens', 'segments'))
  expected, _ = bert.BertEncoder(cfg).apply({'params': bert_params}, tokens, segments, False)
  with torch.no_grad():
    got = model(input_ids=batch['tokens'], token_type_ids=batch['segments']).last_hidden_state
  np.testing.assert_allclose(got.numpy(), np.asarray(expected), rtol=1e-5, atol=1e-5)


def _jax_batch(batch):
  return {k: jnp.asarray(v.numpy()) for k, v in batch.items()}


def test_pretraining_loss_is_the_jax_loss_at_the_same_weights():
  """Without dropout, at the JAX model's weights: the same encoder, heads and loss."""
  cfg, peer, batch = _tiny('bert_base')
  module = bert.BertPretraining(cfg)
  params = perturbed(module.init(jax.random.key(0), _jax_batch(batch), train=False)['params'])
  outputs = module.apply({'params': params}, _jax_batch(batch), train=False)
  expected = float(bert.pretraining_loss(cfg, outputs, _jax_batch(batch))[0])
  model = peer.build(cfg, CPU).modules['bert']
  load_encoder(model.bert, params['bert'], params['pooler'])
  load(
    model.cls,
    {
      'predictions.bias': params['mlm_bias'],
      # The word embeddings, seen again through the tied decoder.
      'predictions.decoder.weight': params['bert']['word_embeddings']['embedding'],
      'predictions.transform.dense.weight': params['mlm_transform']['kernel'].T,
      'predictions.transform.dense.bias': params['mlm_transform']['bias'],
      'predictions.transform.LayerNorm.weight': params['mlm_norm']['scale'],
      'predictions.transform.LayerNorm.bias': params['mlm_norm']['bias'],
      'seq_relationship.weight': params['nsp']['kernel'].T,
      'seq_relationship.bias': params['nsp']['bias'],
    },
  )
  model.eval()
  assert_same_hidden_states(cfg, params['bert'], model.bert, batch)
  with torch.no_grad():
    got = float(bert_peer.pretraining_loss(model, batch))
  np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_squad_loss_is_the_jax_loss_at_the_same_weights():
  cfg, peer, batch = _tiny('bert_squad')
  module = bert.BertSquad(cfg)
  params = perturbed(module.init(jax.random.key(0), _jax_batch(batch), train=False)['params'])
  outputs = module.apply({'params': params}, _jax_batch(batch), train=False)
  expected = float(bert.squad_loss(cfg, outputs, _jax_batch(batch))[0])
  model = peer.build(cfg, CPU).modules['bert']
  load_encoder(model.bert, params['bert'])
  load(model.qa_outputs, {'weight': params['span']['kernel'].T, 'bias': params['span']['bias']})
  model.eval()
  assert_same_hidden_states(cfg, params['bert'], model.bert, batch)
  with torch.no_grad():
    got = float(bert_peer.squad_loss(model, batch))
  np.testing.assert_allclose(got, expected, rtol=1e-5)
