"""unsupmt (XLM): parameter count, greedy generation, back-translation wiring, noise."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import precision
from models import workload as wl
from models.unsupmt import noise, xlm

W = xlm.UNSUPMT
CFG = W.resolve(tiny=True)


def _xlm_params(n_words, dim, n_layers, n_positions, n_langs, is_decoder):
  """sum(p.numel()) of XLM's TransformerModel(with_output=True), which build_model logs, from
  the layer shapes of xlm/model/transformer.py. The heads split `dim` without parameters of
  their own."""
  linear = lambda cin, cout: cin * cout + cout  # nn.Linear with its bias
  layer_norm = 2 * dim
  attention = 4 * linear(dim, dim)  # MultiHeadAttention: q_lin, k_lin, v_lin, out_lin
  ffn = linear(dim, 4 * dim) + linear(4 * dim, dim)  # TransformerFFN: hidden_dim = 4 * dim
  layer = attention + layer_norm + ffn + layer_norm  # attentions, layer_norm1, ffns, layer_norm2
  if is_decoder:
    layer += attention + layer_norm  # encoder_attn, layer_norm15
  # Word, position and language embeddings, then layer_norm_emb.
  embeddings = (n_words + n_positions + n_langs) * dim + layer_norm
  # PredLayer: its proj's weight is the word embeddings (share_inout_emb), its bias its own.
  pred_layer = n_words
  return embeddings + n_layers * layer + pred_layer


def test_full_size_param_count_matches_xlm():
  cfg = W.config
  trainer = W.trainer(cfg, precision.get('fp32'))
  params = jax.eval_shape(trainer.init, jax.random.key(0)).params
  encoder, decoder = wl.count_params(params['encoder']), wl.count_params(params['decoder'])
  shapes = (cfg['vocab'], cfg['d_model'], cfg['layers'], cfg['max_positions'], cfg['n_langs'])
  assert decoder == _xlm_params(*shapes, is_decoder=True)
  # XLM builds the MT encoder with an output layer too, but it never predicts words: its
  # pred_layer bias (n_words) is left out here.
  assert encoder == _xlm_params(*shapes, is_decoder=False) - cfg['vocab']


def test_flops_include_the_generation():
  """Against 6 x params x tokens per update plus 2 x params x tokens per generation."""
  cfg = W.config
  d, v, length, m = cfg['d_model'], cfg['vocab'], cfg['seq_len'], xlm.max_len(cfg)
  # Weights each token meets; the decoder's cross-attention keys/values meet the source.
  enc = cfg['layers'] * (4 * d * d + 2 * d * cfg['ffn'])
  dec = cfg['layers'] * (6 * d * d + 2 * d * cfg['ffn']) + d * v
  cross_kv = cfg['layers'] * 2 * d * d
  src, tgt = length + 2, length + 1

  def train(s):
    return 6 * (enc * s + cross_kv * s + dec * tgt)

  generation = 2 * (enc * src + cross_kv * src + dec * (m - 1))
  estimate = 2 * train(src) + 2 * (train(m) + generation)
  # Attention scores come on top: about 0.5% at these lengths.
  assert 1.0 < W.flops_per_example(cfg) / estimate < 1.02
  assert m == 44  # int(1.3 * 30 + 5)


@pytest.fixture(scope='module')
def tiny():
  """The tiny model's parts, a state, three sentences, and generation jitted once."""
  parts = xlm.build(CFG, precision.get('fp32'))
  state = jax.jit(parts.init)(jax.random.key(0))
  sentences = W.trainer(CFG, precision.get('fp32')).make_batch(jax.random.key(1), 3)['bt'][0]
  generate = jax.jit(
    lambda p, s: xlm.generate(parts.module, p, s, xlm.EN, xlm.FR, xlm.max_len(CFG))
  )
  return parts, state, sentences, generate


def _with_eos_bias(params, bias):
  decoder = dict(params['decoder'])
  decoder['pred_bias'] = decoder['pred_bias'].at[noise.EOS].set(bias)
  return {**params, 'decoder': decoder}


@pytest.mark.slow
def test_generation_stops_at_its_length_and_matches_teacher_forcing(tiny):
  parts, state, src, generate = tiny
  length = xlm.max_len(CFG)
  # EOS never chosen: every row runs to max_len and is closed there.
  never = np.asarray(generate(_with_eos_bias(state.params, -1e4), src))
  assert never.shape == (src.shape[0], length)
  assert (never[:, 0] == noise.EOS).all() and (never[:, -1] == noise.EOS).all()
  assert (never[:, 1:-1] >= noise.FIRST_WORD).all()
  # The cached steps agree with a full teacher-forced pass over the generated prefix.
  logits = jax.jit(parts.module.apply, static_argnums=5)(
    {'params': _with_eos_bias(state.params, -1e4)},
    src,
    xlm.EN,
    jnp.asarray(never[:, :-1]),
    xlm.FR,
    False,
  )
  np.testing.assert_array_equal(np.argmax(logits, -1)[:, :-1], never[:, 1:-1])
  # EOS always chosen: each sentence ends at once and the rest is padding.
  at_once = np.asarray(generate(_with_eos_bias(state.params, 1e4), src))
  assert (at_once[:, :2] == noise.EOS).all() and (at_once[:, 2:] == noise.PAD).all()


@pytest.mark.slow
def test_back_translation_trains_on_the_generated_source(tiny):
  parts, state, sentences, generate = tiny
  rng = jax.random.key(3)
  new_state, loss, generated = jax.jit(lambda st, s, r: parts.bt_step(st, s, xlm.EN, xlm.FR, r))(
    state, sentences, rng
  )
  # The source is the current model's greedy translation, closed by EOS as XLM checks.
  np.testing.assert_array_equal(generated, generate(state.params, sentences))
  assert ((np.asarray(generated) == noise.EOS).sum(axis=1) == 2).all()

  @jax.jit
  def bt_loss(source):
    logits = parts.module.apply(
      {'params': state.params},
      source,
      xlm.FR,
      sentences[:, :-1],
      xlm.EN,
      True,
      rngs={'dropout': rng},
    )
    return xlm.cross_entropy(logits, sentences[:, 1:])

  # The update's loss is the loss of that source (and not of another sentence's).
  np.testing.assert_allclose(loss, bt_loss(generated), rtol=1e-5)
  assert abs(float(loss) - float(bt_loss(jnp.roll(generated, 1, axis=0)))) > 1e-3
  assert new_state.opt_state[1][0].count == 1  # one optimizer update


def test_fp16_step_traces_with_loss_scaling():
  trainer = W.trainer(CFG, precision.get('fp16'))
  state = jax.eval_shape(trainer.init, jax.random.key(0))
  assert state.loss_scale is not None
  batch = jax.eval_shape(lambda r: trainer.make_batch(r, 2), jax.random.key(1))
  new_state, metrics = jax.eval_shape(trainer.step, state, batch, jax.random.key(2))
  assert metrics['loss'].dtype == jnp.float32
  assert jax.tree.structure(new_state) == jax.tree.structure(state)


def _rows(n=64, words=28, seed=0):
  """Rows EOS w.. EOS PAD.. of varying lengths with distinct words, to trace moves."""
  lengths = np.random.default_rng(seed).integers(3, words + 1, n)
  rows = np.full((n, words + 2), noise.PAD, np.int32)
  for i, m in enumerate(lengths):
    rows[i, 0] = rows[i, m + 1] = noise.EOS
    rows[i, 1 : m + 1] = noise.FIRST_WORD + np.arange(m)
  return jnp.asarray(rows), lengths


def test_word_shuffle_moves_words_less_than_three_places():
  rows, lengths = _rows()
  out = np.asarray(jax.jit(noise.word_shuffle, static_argnums=2)(rows, jax.random.key(0), 3.0))
  assert out.shape == rows.shape
  moved = 0
  for row, new, m in zip(np.asarray(rows), out, lengths):
    np.testing.assert_array_equal(new[0], noise.EOS)
    np.testing.assert_array_equal(new[m + 1 :], row[m + 1 :])  # closing EOS and padding stay
    assert sorted(new[1 : m + 1]) == sorted(row[1 : m + 1])
    displacement = np.abs(np.argsort(new[1 : m + 1]) - np.arange(m))
    assert displacement.max() < 3
    moved += int((displacement > 0).sum())
  assert moved > 0.2 * lengths.sum()


def test_word_dropout_keeps_a_subsequence_and_pads_the_end():
  rows, lengths = _rows()
  dropout = jax.jit(noise.word_dropout, static_argnums=2)
  out = np.asarray(dropout(rows, jax.random.key(1), 0.1))
  assert out.shape == rows.shape
  dropped = 0
  for row, new, m in zip(np.asarray(rows), out, lengths):
    n = int((new != noise.PAD).sum())
    assert new[0] == noise.EOS and new[n - 1] == noise.EOS and (new[n:] == noise.PAD).all()
    kept = new[1 : n - 1]
    assert 1 <= len(kept) <= m and (np.diff(kept) > 0).all()  # in order, a subsequence
    assert set(kept) <= set(row[1 : m + 1])
    dropped += m - len(kept)
  assert 0.05 < dropped / lengths.sum() < 0.15
  # Dropping everything still leaves one word, as XLM does.
  out = np.asarray(dropout(rows, jax.random.key(2), 0.999999))
  assert ((out != noise.PAD).sum(axis=1) == 3).all()


def test_word_blank_masks_only_words_and_noise_keeps_shapes():
  rows, lengths = _rows()
  out = np.asarray(jax.jit(noise.word_blank, static_argnums=2)(rows, jax.random.key(3), 0.1))
  changed = out != np.asarray(rows)
  assert (out[changed] == noise.MASK).all()
  assert not changed[:, 0].any() and not changed[np.arange(len(rows)), lengths + 1].any()
  assert 0.05 < changed.sum() / lengths.sum() < 0.15
  noisy = jax.jit(lambda r, k: noise.add_noise(r, k, CFG))(rows, jax.random.key(4))
  assert noisy.shape == rows.shape and noisy.dtype == rows.dtype
