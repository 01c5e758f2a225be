"""Transformer Big: fairseq's parameter count, the causal decoder, one shared embedding, and
label smoothing."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import precision, transformer
from models import workload as wl

W = transformer.TRANSFORMER_BIG


def _reference_params(vocab=32768, d=1024, ffn=4096, encoder_layers=6, decoder_layers=6):
  """fairseq's transformer_vaswani_wmt_en_de_big with --share-all-embeddings, from the layer
  shapes of fairseq/models/transformer.py and fairseq/modules/transformer_layer.py: one
  embedding table (the output projection is that table, without bias), sinusoidal positions
  (no parameters), post-norm layers (no final LayerNorm), every Linear with a bias."""
  attention = 4 * (d * d + d)  # q, k, v and out projections
  feed_forward = (d * ffn + ffn) + (ffn * d + d)
  norm = 2 * d
  encoder_layer = attention + feed_forward + 2 * norm
  decoder_layer = 2 * attention + feed_forward + 3 * norm  # self- and encoder attention
  return vocab * d + encoder_layers * encoder_layer + decoder_layers * decoder_layer


def test_full_size_parameter_count_matches_fairseq():
  trainer = W.trainer(W.resolve(), precision.get('fp32'))
  state = jax.eval_shape(trainer.init, jax.random.key(0))
  assert wl.count_params(state.params) == _reference_params()


@pytest.fixture(scope='module')
def tiny():
  """The tiny config, a batch of 2, the model and its eval-mode variables."""
  cfg = W.resolve(tiny=True)
  model = transformer.TransformerBig(cfg)
  batch = transformer.make_batch(cfg, jax.random.key(1), 2)
  variables = jax.jit(lambda b: model.init(jax.random.key(0), b, train=False))(batch)
  return cfg, batch, model, variables


def test_decoder_does_not_see_future_targets(tiny):
  cfg, batch, model, variables = tiny
  apply = jax.jit(lambda b: model.apply(variables, b, train=False))
  t = cfg['tgt_len'] // 2
  target_in = batch['target_in']
  changed = target_in.at[:, t].set(target_in[:, t] % (cfg['vocab'] - 1) + 1)
  assert not np.array_equal(changed, target_in)
  logits, new_logits = apply(batch), apply({**batch, 'target_in': changed})
  np.testing.assert_array_equal(new_logits[:, :t], logits[:, :t])
  # Position t and later read the changed token, so the check above is not vacuous.
  assert not np.allclose(new_logits[:, t:], logits[:, t:])


def test_encoder_decoder_and_output_projection_share_one_array(tiny):
  """One (vocab, d) array; a token seen only by the encoder, one seen only by the decoder and
  one seen by neither (the output projection alone) all move that array's gradient."""
  cfg, _, model, variables = tiny
  v, d = cfg['vocab'], cfg['d_model']
  tables = [p for p in jax.tree.leaves(variables) if v in p.shape]
  assert [t.shape for t in tables] == [(v, d)]
  n, s, t = 2, cfg['src_len'], cfg['tgt_len']
  source_only, decoder_only, neither = 3, 11, v - 1
  batch = {
    'source': jnp.full((n, s), source_only, jnp.int32),
    'target_in': jnp.full((n, t), decoder_only, jnp.int32),
    'target': jnp.full((n, t), 20, jnp.int32),
  }

  def loss(params):
    logits = model.apply({'params': params}, batch, train=False)
    return transformer.loss(cfg, logits, batch)[0]

  grads = jax.jit(jax.grad(loss))(variables['params'])
  table = np.abs(np.asarray(grads['shared_embedding']['embedding']))
  assert table[source_only].max() > 0 and table[decoder_only].max() > 0 and table[neither].max() > 0


def test_label_smoothing_is_fairseqs_formula():
  """fairseq's label_smoothed_nll_loss: (1 - eps) * nll + eps / V * sum_v(-log p_v); padded
  targets (weight 0) count for nothing."""
  probs = np.array([[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
  targets = np.array([3, 0, 1])
  weights = np.array([1.0, 1.0, 0.0])
  eps = 0.1
  value, nll = transformer.label_smoothed_nll(
    jnp.log(probs)[None], jnp.asarray(targets)[None], eps, jnp.asarray(weights)[None]
  )
  nll_0, nll_1 = -math.log(0.4), -math.log(0.25)
  smooth_0 = -(math.log(0.1) + math.log(0.2) + math.log(0.3) + math.log(0.4))
  smooth_1 = -4 * math.log(0.25)
  expected = ((0.9 * nll_0 + 0.025 * smooth_0) + (0.9 * nll_1 + 0.025 * smooth_1)) / 2
  np.testing.assert_allclose(float(value), expected, rtol=1e-6)
  np.testing.assert_allclose(float(nll), (nll_0 + nll_1) / 2, rtol=1e-6)
