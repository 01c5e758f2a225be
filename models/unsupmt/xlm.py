"""XLM unsupervised MT en-fr (Lample & Conneau 2019): denoising auto-encoding + back-translation.

One iteration is XLM's EncDecTrainer loop with --ae_steps 'en,fr' --bt_steps
'en-fr-en,fr-en-fr': two denoising auto-encoder steps, then two online
back-translation steps in which the current model greedily translates a batch (no
gradient, max length 1.3 x L + 5) and is trained on generated -> original. Each of
the four is its own optimizer update, and the generation is compiled with the rest.
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from models import transformer
from models import workload as wl
from models.layers import cross_entropy as cross_entropy_layers
from models.layers import rbg_init
from models.unsupmt.model import EncoderDecoder
from models.unsupmt.noise import EOS, FIRST_WORD, PAD, add_noise

EN, FR = 0, 1


def max_len(cfg):
  """XLM's generation cap, int(1.3 * len + 5), len counting both EOS."""
  return int(1.3 * (cfg['seq_len'] + 2) + 5)


def make_batch(cfg, rng, n):
  """Monolingual sentences `EOS w1 .. wL EOS`, a fresh batch for each sub-step as XLM draws.

  'ae' and 'bt' are stacked [en, fr]: 2 x n x (L + 2).
  """
  words = jax.random.randint(rng, (4, n, cfg['seq_len']), FIRST_WORD, cfg['vocab'], jnp.int32)
  eos = jnp.full((4, n, 1), EOS, jnp.int32)
  sentences = jnp.concatenate([eos, words, eos], axis=2)
  return {'ae': sentences[:2], 'bt': sentences[2:]}


def cross_entropy(logits_BxTxV, targets_BxT):
  """XLM's PredLayer loss: mean cross-entropy over the predicted (non-pad) tokens."""
  per_token = cross_entropy_layers.token_losses(logits_BxTxV, targets_BxT)[1]
  weights = (targets_BxT != PAD).astype(jnp.float32)
  return (per_token * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def optimizer(cfg):
  """XLM's adam_inverse_sqrt (betas 0.9/0.98) after clip_grad_norm (default 5) over all params."""
  schedule = transformer.inverse_sqrt(cfg['lr'], cfg['warmup'])
  return optax.chain(
    optax.clip_by_global_norm(cfg['clip_norm']), optax.adam(schedule, b1=0.9, b2=0.98, eps=1e-8)
  )


def generate(module, params, src_BxS, src_lang, tgt_lang, length):
  """XLM's greedy TransformerModel.generate over fixed shapes: B x length tokens.

  Row: EOS, the generated words, EOS, then PAD. The loop stops when every sentence
  has produced EOS (as XLM's `break`), else after length - 1 steps; sentences still
  open then get EOS in the last column. Evaluation mode (no dropout).
  """
  apply = lambda method, *args: module.apply({'params': params}, *args, method=method)
  memory = apply(EncoderDecoder.encode, src_BxS, src_lang, False)
  memory_kv = apply(EncoderDecoder.memory_kv, memory)
  src_valid = src_BxS != PAD
  batch = src_BxS.shape[0]
  k0 = memory_kv[0][0]
  cache = [(jnp.zeros((batch, length) + k0.shape[2:], k0.dtype),) * 2 for _ in memory_kv]
  tokens = jnp.full((batch, length), PAD, jnp.int32).at[:, 0].set(EOS)

  def unfinished_left(carry):
    t, _, _, unfinished = carry
    return (t < length) & unfinished.any()

  def next_token(carry):
    t, tokens, cache, unfinished = carry
    last = jax.lax.dynamic_slice_in_dim(tokens, t - 1, 1, axis=1)
    logits, cache = apply(
      EncoderDecoder.decode_step, last, t - 1, tgt_lang, cache, memory_kv, src_valid
    )
    word = jnp.argmax(logits.astype(jnp.float32), axis=-1).astype(jnp.int32)
    column = jnp.where(unfinished, word, PAD)
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, column[:, None], t, axis=1)
    return t + 1, tokens, cache, unfinished & (word != EOS)

  carry = (jnp.int32(1), tokens, cache, jnp.ones((batch,), bool))
  _, tokens, _, unfinished = jax.lax.while_loop(unfinished_left, next_token, carry)
  return tokens.at[:, -1].set(jnp.where(unfinished, EOS, tokens[:, -1]))


class Parts(NamedTuple):
  """The pieces of one iteration, exposed for tests."""

  module: EncoderDecoder
  init: Callable[[jax.Array], wl.TrainState]
  update: Callable[..., tuple[wl.TrainState, jax.Array]]
  ae_step: Callable[..., tuple[wl.TrainState, jax.Array]]
  bt_step: Callable[..., tuple[wl.TrainState, jax.Array, jax.Array]]


def build(cfg, policy) -> Parts:
  module = EncoderDecoder(cfg, policy.compute_dtype)
  tx = optimizer(cfg)
  gen_len = max_len(cfg)

  def init(rng):
    params_rng, dropout_rng = jax.random.split(rng)
    src = jnp.full((1, cfg['seq_len'] + 2), EOS, jnp.int32)
    params = module.init(
      {'params': params_rng, 'dropout': dropout_rng}, src, EN, src[:, :-1], FR, False
    )['params']
    return wl.TrainState.create(params, tx, policy)

  def update(state, src_BxS, src_lang, tgt_BxT, tgt_lang, rng):
    """One supervised optimizer update: predict tgt[1:] from src and tgt[:-1]."""

    def loss_fn(params):
      logits = module.apply(
        {'params': params},
        src_BxS,
        src_lang,
        tgt_BxT[:, :-1],
        tgt_lang,
        True,
        rngs={'dropout': rng},
      )
      return cross_entropy(logits, tgt_BxT[:, 1:])

    if state.loss_scale is None:
      value, grads = jax.value_and_grad(loss_fn)(state.params)
      finite, loss_scale = None, None
    else:
      loss_scale, finite, value, grads = state.loss_scale.value_and_grad(loss_fn)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    if finite is not None:
      # An overflowed update changes nothing but the scale.
      keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
      params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
    return state.replace(params=params, opt_state=opt_state, loss_scale=loss_scale), value

  def ae_step(state, sentences_BxL, lang, rng):
    """Denoising auto-encoding: noisy sentence -> sentence, both in `lang`."""
    noise_rng, dropout_rng = jax.random.split(rng)
    noisy = add_noise(sentences_BxL, noise_rng, cfg)
    return update(state, noisy, lang, sentences_BxL, lang, dropout_rng)

  def bt_step(state, sentences_BxL, lang1, lang2, rng):
    """Back-translation lang1 -> lang2 -> lang1; also returns the generated source."""
    # Generation reads the parameters outside the differentiated loss: no gradient.
    generated = jax.lax.stop_gradient(
      generate(module, state.params, sentences_BxL, lang1, lang2, gen_len)
    )
    state, value = update(state, generated, lang2, sentences_BxL, lang1, rng)
    return state, value, generated

  return Parts(module, init, update, ae_step, bt_step)


def trainer(cfg, policy) -> wl.Trainer:
  parts = build(cfg, policy)
  langs = jnp.array([EN, FR], jnp.int32)

  def step(state, batch, rng):
    # RBG keys: threefry's unrolled rounds at each of the twelve attention-weight dropouts
    # make the step's compile twice as long.
    rng = rbg_init.rbg_key(jax.random.fold_in(rng, state.step))
    ae_rngs = jax.random.split(jax.random.fold_in(rng, 0), 2)
    bt_rngs = jax.random.split(jax.random.fold_in(rng, 1), 2)

    # Each pair of sub-steps is one scanned body: compiled once, run for en then fr.
    def ae_body(state, xs):
      sentences, lang, sub_rng = xs
      return parts.ae_step(state, sentences, lang, sub_rng)

    def bt_body(state, xs):
      sentences, lang, sub_rng = xs
      state, value, _ = parts.bt_step(state, sentences, lang, 1 - lang, sub_rng)
      return state, value

    state, ae_losses = jax.lax.scan(ae_body, state, (batch['ae'], langs, ae_rngs))
    state, bt_losses = jax.lax.scan(bt_body, state, (batch['bt'], langs, bt_rngs))
    metrics = {
      'loss': (ae_losses.sum() + bt_losses.sum()) / 4,
      'ae_loss': ae_losses.mean(),
      'bt_loss': bt_losses.mean(),
    }
    return state.replace(step=state.step + 1), metrics

  return wl.Trainer(init=parts.init, make_batch=lambda rng, n: make_batch(cfg, rng, n), step=step)


def flops_per_example(cfg):
  """Training FLOPs of one sentence in each of the four sub-steps, generation included.

  Counts what the compiled step computes: 3 x forward for each update; the greedy
  generation's forward passes (encoder, cross-attention keys once, then max_len - 1
  cached decoder steps attending over the whole fixed-length cache).
  """
  d, f, v = cfg['d_model'], cfg['ffn'], cfg['vocab']
  n, length, m = cfg['layers'], cfg['seq_len'], max_len(cfg)

  def encoder(s):
    return n * s * (8 * d * d + 4 * d * f + 4 * s * d)

  def decoder_token(t, s):  # self-attention over t keys, cross-attention over s
    return n * (8 * d * d + 4 * t * d + 4 * d * d + 4 * s * d + 4 * d * f) + 2 * d * v

  def train(s, t):
    return 3 * (encoder(s) + t * decoder_token(t, s) + n * s * 4 * d * d)

  src, tgt = length + 2, length + 1  # decoder input drops the closing EOS
  generation = encoder(src) + n * src * 4 * d * d + (m - 1) * decoder_token(m, src)
  return float(2 * train(src, tgt) + 2 * (train(m, tgt) + generation))


def check(cfg):
  """Whole heads, and a position embedding for every token a generation can reach."""
  d, heads, positions = cfg['d_model'], cfg['heads'], cfg['max_positions']
  return wl.first(
    (d % heads != 0, f'heads ({heads}) must divide d_model ({d})'),
    (
      max_len(cfg) > positions,
      f'max_positions ({positions}) must cover a generation of int(1.3 * (seq_len + 2) + 5) '
      f'= {max_len(cfg)} tokens',
    ),
  )


UNSUPMT = wl.Workload(
  name='unsupmt',
  description='XLM unsupervised MT en-fr: 2 denoising AE + 2 online back-translation steps',
  unit='tokens',
  throughput_unit='target tokens/s',
  config=dict(
    vocab=64139,  # XLM's en-fr joint BPE dictionary (60k codes), n_words of mlm_enfr_1024
    d_model=1024,
    ffn=4096,
    heads=8,
    layers=6,
    max_positions=512,
    n_langs=2,
    dropout=0.1,
    attention_dropout=0.1,
    word_shuffle=3.0,
    word_dropout=0.1,
    word_blank=0.1,
    lr=1e-4,
    warmup=4000,
    clip_norm=5.0,
    # Fixed BPE tokens per sentence (EOS excluded): NewsCrawl sentences average
    # ~25 Moses tokens, which XLM's 60k BPE stretches to ~28; see README "unsupmt".
    seq_len=28,
  ),
  tiny=dict(
    vocab=64, d_model=32, ffn=64, heads=4, layers=2, max_positions=32, lr=3e-3, warmup=20, seq_len=6
  ),
  spec=dict(
    vocab=wl.Key(lo=FIRST_WORD + 1),  # the special tokens, and one word
    n_langs=wl.Key(lo=2),
    dropout=wl.FRACTION,
    attention_dropout=wl.FRACTION,
    word_dropout=wl.FRACTION,
    word_blank=wl.FRACTION,
  ),
  check=check,
  trainer=trainer,
  flops_per_example=flops_per_example,
  # tokens_per_batch counts each sentence's length + 2 (its two EOS).
  example_size=lambda cfg: cfg['seq_len'] + 2,
  # XLM's processed_w: len - 1 predicted tokens per sentence in each of the four steps.
  units_per_example=lambda cfg: 4 * (cfg['seq_len'] + 1),
  revision=4,
)
