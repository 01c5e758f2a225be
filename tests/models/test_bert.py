"""BERT SQuAD: the reference's parameter count, its span loss and its synthetic spans."""

import flax.linen as nn
import jax
import numpy as np

from models import bert, precision
from models import workload as wl
from models.layers import attention


def _reference_qa_params(vocab=30522, h=768, layers=12, ffn=3072, positions=512, types=2):
  """HF BertForQuestionAnswering (no pooler): embeddings, layers, qa_outputs Linear(h, 2)."""
  embeddings = (vocab + positions + types) * h + 2 * h  # three tables and a LayerNorm
  layer = 4 * (h * h + h) + 2 * h + (h * ffn + ffn) + (ffn * h + h) + 2 * h
  return embeddings + layers * layer + (2 * h + 2)


def test_squad_param_count_matches_reference():
  w = bert.BERT_SQUAD
  trainer = w.trainer(w.resolve(), precision.get('fp32'))
  state = jax.eval_shape(trainer.init, jax.random.key(0))
  assert wl.param_counts(trainer, state)['total'] == _reference_qa_params()


def _reference_pretraining_params(vocab=30522, h=768):
  """HF BertForPreTraining: the encoder, the pooler (h -> h), the MLM transform (dense h -> h
  and a LayerNorm) with an output bias over the vocabulary (its weight is the word embedding),
  and the NSP Linear(h, 2)."""
  encoder = _reference_qa_params(vocab, h) - (2 * h + 2)
  return encoder + (h * h + h) + (h * h + h + 2 * h + vocab) + (2 * h + 2)


def test_bert_base_param_count_matches_reference():
  w = bert.BERT_BASE
  state = jax.eval_shape(w.trainer(w.resolve(), precision.get('fp32')).init, jax.random.key(0))
  assert wl.count_params(state.params) == _reference_pretraining_params()


def test_pretraining_loss_is_weighted_mlm_plus_nsp_cross_entropy():
  """BERT's loss on a hand-made batch: the masked-LM cross-entropy averaged over the weighted
  positions (a weight-0 slot counts for nothing), plus the mean next-sentence cross-entropy."""
  mlm_probs = np.array([[[0.5, 0.25, 0.25], [0.2, 0.2, 0.6]], [[0.1, 0.8, 0.1], [1 / 3] * 3]])
  nsp_probs = np.array([[0.9, 0.1], [0.4, 0.6]])
  batch = {
    'masked_ids': np.array([[0, 2], [1, 0]]),
    'masked_weights': np.array([[1.0, 1.0], [1.0, 0.0]]),
    'next_sentence': np.array([1, 1]),
  }
  loss, metrics = bert.pretraining_loss(None, (np.log(mlm_probs), np.log(nsp_probs)), batch)
  mlm = -(np.log(0.5) + np.log(0.6) + np.log(0.8)) / 3
  nsp = -(np.log(0.1) + np.log(0.6)) / 2
  np.testing.assert_allclose(float(metrics['mlm_loss']), mlm, rtol=1e-6)
  np.testing.assert_allclose(float(metrics['nsp_loss']), nsp, rtol=1e-6)
  np.testing.assert_allclose(float(loss), mlm + nsp, rtol=1e-6)


def test_padded_keys_change_nothing():
  """Tokens attend only to non-PAD keys: changing a padded position's embedding (through its
  segment id) leaves every real token's output as it was, while the same change at a real
  position reaches the others."""
  cfg = bert.BERT_BASE.resolve(tiny=True)
  encoder = bert.BertEncoder(cfg)
  length, real = 8, 5
  tokens = np.zeros((1, length), np.int32)
  tokens[0, :real] = np.arange(3, 3 + real)
  segments = np.zeros((1, length), np.int32)
  params = encoder.init(jax.random.key(0), tokens, segments, False)
  apply = jax.jit(lambda s: encoder.apply(params, tokens, s, False)[0])
  hidden = np.asarray(apply(segments))
  padded, unpadded = segments.copy(), segments.copy()
  padded[0, real + 1] = 1
  unpadded[0, real - 1] = 1
  np.testing.assert_array_equal(np.asarray(apply(padded))[:, :real], hidden[:, :real])
  assert not np.allclose(np.asarray(apply(unpadded))[:, : real - 1], hidden[:, : real - 1])


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_squad_loss_is_mean_of_start_and_end_cross_entropy():
  cfg = bert.BERT_SQUAD.resolve(tiny=True)
  model = bert.BertSquad(cfg)
  batch = jax.jit(lambda rng: bert.squad_batch(cfg, rng, 3))(jax.random.key(1))
  params = jax.jit(lambda rng: model.init(rng, batch, train=False))(jax.random.key(0))
  start_logits, end_logits = jax.jit(lambda p: model.apply(p, batch, train=False))(params)
  assert start_logits.shape == end_logits.shape == (3, cfg['seq_len'])
  loss, metrics = bert.squad_loss(cfg, (start_logits, end_logits), batch)

  rows = np.arange(3)
  start_ce = -_log_softmax(np.asarray(start_logits))[rows, np.asarray(batch['start_positions'])]
  end_ce = -_log_softmax(np.asarray(end_logits))[rows, np.asarray(batch['end_positions'])]
  np.testing.assert_allclose(float(metrics['start_loss']), start_ce.mean(), rtol=1e-5)
  np.testing.assert_allclose(float(metrics['end_loss']), end_ce.mean(), rtol=1e-5)
  np.testing.assert_allclose(float(loss), (start_ce.mean() + end_ce.mean()) / 2, rtol=1e-5)
  assert not np.isclose(start_ce.mean(), end_ce.mean())  # the two terms are really distinct


def test_squad_spans_lie_in_the_context():
  cfg = bert.BERT_SQUAD.resolve()
  batch = jax.jit(lambda rng: bert.squad_batch(cfg, rng, 64))(jax.random.key(2))
  start, end = np.asarray(batch['start_positions']), np.asarray(batch['end_positions'])
  segments = np.asarray(batch['segments'])
  assert batch['tokens'].shape == (64, 384)
  assert (segments[np.arange(64), start] == 1).all()  # answers start in the context
  assert (start <= end).all() and (end < 384 - 1).all() and (end - start < 30).all()


def _attention_modules(model, batch):
  """(broadcast_dropout, dropout_rate) of every attention layer a training step runs."""
  seen = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, attention.MultiHead) and context.method_name == ('__call__'):
      seen.append((context.module.broadcast_dropout, context.module.dropout_rate))
    return next_fun(*args, **kwargs)

  params = model.init(jax.random.key(0), batch, train=False)
  with nn.intercept_methods(record):
    model.apply(params, batch, train=True, rngs={'dropout': jax.random.key(1)})
  return seen


def test_encoder_drops_attention_probabilities_per_sequence_and_head():
  """As BERT's dropout on [B, N, F, T] (tests/models/test_attention.py tests the masks)."""
  cfg = bert.BERT_BASE.resolve(tiny=True)
  batch = bert.make_batch(cfg, jax.random.key(2), 2)
  seen = _attention_modules(bert.BertPretraining(cfg), batch)
  assert seen == [(False, cfg['dropout'])] * cfg['layers']


def test_joined_projections_train_as_flax_attention_does():
  """--set=projections=flax (Flax's MultiHeadDotProductAttention) and the default 'joined'
  (MultiHead): the same parameters from the same key, and the same loss and gradients of a
  training step with dropout on (test_attention.py compares the two modules alone)."""
  joined = bert.BERT_BASE.resolve(tiny=True)
  flax_form = bert.BERT_BASE.resolve(tiny=True, overrides={'projections': 'flax'})
  assert joined['projections'] == 'joined' and flax_form['projections'] == 'flax'
  batch = bert.make_batch(joined, jax.random.key(2), 2)

  def loss_and_grads(cfg):
    model = bert.BertPretraining(cfg)
    params = model.init(jax.random.key(0), batch, train=False)

    def loss(params):
      outputs = model.apply(params, batch, train=True, rngs={'dropout': jax.random.key(1)})
      return bert.pretraining_loss(cfg, outputs, batch)[0]

    return params, jax.value_and_grad(loss)(params)

  want_params, want = loss_and_grads(flax_form)
  got_params, got = loss_and_grads(joined)
  assert jax.tree.structure(got_params) == jax.tree.structure(want_params)
  for a, b in zip(jax.tree.leaves(want_params), jax.tree.leaves(got_params)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
