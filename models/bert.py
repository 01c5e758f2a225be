"""BERT (Devlin et al. 2018): the shared encoder and BERT-base pretraining (MLM + NSP)."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models import transformer
from models import workload as wl
from models.layers import attention as attention_layers
from models.layers import cross_entropy as cross_entropy_layers
from models.layers import dropout as dropout_layers
from models.layers import embed as embed_layers
from models.layers import gelu as gelu_layers

LN_EPS = 1e-12  # BERT's LayerNorm epsilon
PAD = 0
# The erf form, as Hugging Face's BertModel (Google's BERT computes the tanh approximation:
# docs/workloads.md), keeping only its input for the backward pass.
gelu = gelu_layers.gelu
dense_init = nn.initializers.truncated_normal(0.02)


class BertEncoder(nn.Module):
  """Token, position and segment embeddings, then post-LN transformer layers.

  Returns the hidden states and the embedding module, whose table the MLM
  head reuses as its output projection.
  """

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens_BxL, segments_BxL, train):
    cfg = self.cfg
    h = cfg['hidden']
    embed = embed_layers.Embed(
      cfg['vocab'], h, embedding_init=dense_init, dtype=self.dtype, name='word_embeddings'
    )
    positions = self.param('position_embeddings', dense_init, (cfg['max_positions'], h))
    segment = embed_layers.Embed(
      cfg['type_vocab'],
      h,
      embedding_init=dense_init,
      dtype=self.dtype,
      name='token_type_embeddings',
    )
    # Each token gathers its position's row (the table's gradient is a scatter-add), where a
    # slice broadcast over the batch would make that gradient a reduction over the batch: for it
    # XLA's GPU layout assignment puts the batch in the minor dimension of every array of the
    # encoder, and each LayerNorm then transposes (docs/performance.md, "The encoder's layout").
    position_ids_BxL = jnp.broadcast_to(jnp.arange(tokens_BxL.shape[1]), tokens_BxL.shape)
    x = (
      embed(tokens_BxL)
      + segment(segments_BxL)
      + jnp.take(positions, position_ids_BxL, axis=0).astype(self.dtype)
    )
    x = nn.LayerNorm(epsilon=LN_EPS, dtype=self.dtype, name='embeddings_norm')(x)
    x = dropout_layers.layer(cfg['dropout'], cfg['dropout_draw'], not train)(x)
    valid = tokens_BxL != PAD
    mask = nn.make_attention_mask(valid, valid)
    for i in range(cfg['layers']):
      x = transformer.PostLNLayer(
        heads=cfg['heads'],
        ffn=cfg['ffn'],
        dropout=cfg['dropout'],
        attention_dropout=cfg['dropout'],
        attention_probs=cfg['attention_probs'],
        projections=cfg['projections'],
        dropout_draw=cfg['dropout_draw'],
        activation=gelu,
        ln_eps=LN_EPS,
        dtype=self.dtype,
        name=f'layer_{i}',
      )(x, mask, train)
    return x, embed


class Pooler(nn.Module):
  """Dense + tanh over the first ([CLS]) position."""

  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, hidden_BxLxH):
    first = hidden_BxLxH[:, 0]
    return jnp.tanh(nn.Dense(first.shape[-1], kernel_init=dense_init, dtype=self.dtype)(first))


class BertPretraining(nn.Module):
  """BERT with the masked-LM head (over gathered positions) and next-sentence head."""

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch, train):
    hidden, embed = BertEncoder(self.cfg, self.dtype, name='bert')(
      batch['tokens'], batch['segments'], train
    )
    # Gather the masked positions before the vocabulary projection: the
    # 30522-way softmax runs on 20 positions per sequence, not all 128.
    picked_BxPxH = jnp.take_along_axis(hidden, batch['masked_positions'][..., None], axis=1)
    x = nn.Dense(hidden.shape[-1], kernel_init=dense_init, dtype=self.dtype, name='mlm_transform')(
      picked_BxPxH
    )
    x = nn.LayerNorm(epsilon=LN_EPS, dtype=self.dtype, name='mlm_norm')(gelu(x))
    mlm_bias = self.param('mlm_bias', nn.initializers.zeros, (self.cfg['vocab'],))
    mlm_logits_BxPxV = embed.attend(x) + mlm_bias.astype(self.dtype)
    pooled = Pooler(self.dtype, name='pooler')(hidden)
    nsp_logits_Bx2 = nn.Dense(2, kernel_init=dense_init, dtype=self.dtype, name='nsp')(pooled)
    return mlm_logits_BxPxV, nsp_logits_Bx2


def make_batch(cfg, rng, n):
  """Full-length sequence pairs with `masked` gathered positions and NSP labels."""
  tok_rng, pos_rng, lab_rng, nsp_rng = jax.random.split(rng, 4)
  length, masked = cfg['seq_len'], cfg['masked']
  tokens = jax.random.randint(tok_rng, (n, length), 1, cfg['vocab'], jnp.int32)
  segments = (jnp.arange(length) >= length // 2).astype(jnp.int32)[None].repeat(n, axis=0)
  # Distinct positions per sequence, as BERT's data pipeline draws them (never [CLS]).
  scores = jax.random.uniform(pos_rng, (n, length - 1))
  positions = 1 + jax.lax.top_k(scores, masked)[1].astype(jnp.int32)
  return {
    'tokens': tokens,
    'segments': segments,
    'masked_positions': positions,
    'masked_ids': jax.random.randint(lab_rng, (n, masked), 1, cfg['vocab'], jnp.int32),
    'masked_weights': jnp.ones((n, masked), jnp.float32),
    'next_sentence': jax.random.bernoulli(nsp_rng, 0.5, (n,)).astype(jnp.int32),
  }


def cross_entropy(logits, labels):
  """Per-example softmax cross-entropy in float32."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)


def pretraining_loss(cfg, outputs, batch):
  del cfg
  mlm_logits, nsp_logits = outputs
  weights = batch['masked_weights']
  mlm_nll = cross_entropy_layers.token_losses(mlm_logits, batch['masked_ids'])[1]
  mlm = (mlm_nll * weights).sum() / jnp.maximum(weights.sum(), 1.0)
  nsp = cross_entropy(nsp_logits, batch['next_sentence']).mean()
  return mlm + nsp, {'mlm_loss': mlm, 'nsp_loss': nsp}


def _decay_mask(params):
  """AdamW decays every weight matrix; LayerNorm parameters and biases are exempt."""

  def decays(path, _):
    name = path[-1].key
    return name not in ('bias', 'scale', 'mlm_bias')

  return jax.tree_util.tree_map_with_path(decays, params)


def adamw(cfg):
  """BERT's AdamW: linear warm-up to lr, then linear decay to 0; eps 1e-6, wd 0.01."""
  schedule = optax.join_schedules(
    [
      optax.linear_schedule(0.0, cfg['lr'], cfg['warmup']),
      optax.linear_schedule(cfg['lr'], 0.0, max(cfg['total_steps'] - cfg['warmup'], 1)),
    ],
    [cfg['warmup']],
  )
  return optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, mask=_decay_mask)


def encoder_flops_per_token(cfg, length):
  """Forward matmul FLOPs of the encoder per token at sequence length `length`."""
  h, f = cfg['hidden'], cfg['ffn']
  return cfg['layers'] * (8 * h * h + 4 * h * f + 4 * length * h)


def pretraining_flops(cfg):
  h, length = cfg['hidden'], cfg['seq_len']
  forward = (
    length * encoder_flops_per_token(cfg, length)
    + cfg['masked'] * (2 * h * h + 2 * h * cfg['vocab'])  # MLM transform, projection
    + 2 * h * h
    + 2 * h * 2
  )  # pooler, NSP
  return 3.0 * forward


BERT_BASE_CONFIG = dict(
  vocab=30522,
  hidden=768,
  layers=12,
  heads=12,
  ffn=3072,
  max_positions=512,
  type_vocab=2,
  dropout=0.1,
  attention_probs='auto',  # models/layers/attention.PROBS
  projections='joined',  # models/layers/attention.PROJECTIONS
  dropout_draw='grouped',  # models/layers/dropout.DRAWS: four keep decisions a hash
  seq_len=128,
  masked=20,
  lr=1e-4,
  warmup=10000,
  total_steps=1000000,
)
# What the keys accept beyond their type's range (workload.Key), and together.
ENCODER_SPEC = dict(
  vocab=wl.Key(lo=2),
  type_vocab=wl.Key(lo=2),
  dropout=wl.FRACTION,
  warmup=wl.NATURAL,
  attention_probs=wl.Key(choices=attention_layers.PROBS),
  projections=wl.Key(choices=attention_layers.PROJECTIONS),
  dropout_draw=wl.Key(choices=dropout_layers.DRAWS),
)


def check_encoder(cfg):
  """What the encoder assumes: whole heads, a position embedding for every token."""
  h, heads, length, positions = cfg['hidden'], cfg['heads'], cfg['seq_len'], cfg['max_positions']
  return wl.first(
    (h % heads != 0, f'heads ({heads}) must divide hidden ({h})'),
    (length > positions, f'seq_len ({length}) must be at most max_positions ({positions})'),
  )


def check_pretraining(cfg):
  masked, length = cfg['masked'], cfg['seq_len']
  return check_encoder(cfg) or wl.first(
    (masked >= length, f'masked ({masked}) must be less than seq_len ({length})'),
  )


# The encoder of every tiny BERT preset (bert_base, bert_squad, mt_dnn).
TINY_ENCODER = dict(vocab=128, hidden=32, layers=2, heads=4, ffn=64, max_positions=32)
BERT_TINY = dict(
  TINY_ENCODER,
  seq_len=16,
  masked=4,
  lr=1e-3,
  warmup=1,
  total_steps=1000,
)

BERT_BASE = wl.Workload(
  name='bert_base',
  description='BERT-base uncased pretraining at sequence length 128 (MLM on 20 positions + NSP)',
  unit='sequences',
  throughput_unit='sequences/s',
  config=BERT_BASE_CONFIG,
  tiny=BERT_TINY,
  spec=ENCODER_SPEC,
  check=check_pretraining,
  trainer=wl.supervised(
    lambda cfg, dtype: BertPretraining(cfg, dtype), make_batch, pretraining_loss, adamw
  ),
  flops_per_example=pretraining_flops,
  revision=11,
)


# --- SQuAD 1.1 fine-tuning: BERT-base with a span head (Google's run_squad.py) ---


class BertSquad(nn.Module):
  """BERT with a dense layer to (start, end) logits per token; no pooler, as the reference."""

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch, train):
    hidden, _ = BertEncoder(self.cfg, self.dtype, name='bert')(
      batch['tokens'], batch['segments'], train
    )
    logits_BxLx2 = nn.Dense(2, kernel_init=dense_init, dtype=self.dtype, name='span')(hidden)
    return logits_BxLx2[..., 0], logits_BxLx2[..., 1]


def squad_batch(cfg, rng, n):
  """[CLS] question [SEP] context [SEP] at full length, with a short answer span in the context."""
  tok_rng, start_rng, len_rng = jax.random.split(rng, 3)
  length, question = cfg['seq_len'], cfg['question_len']
  tokens = jax.random.randint(tok_rng, (n, length), 1, cfg['vocab'], jnp.int32)
  segments = (jnp.arange(length) >= question).astype(jnp.int32)[None].repeat(n, axis=0)
  # Answers lie in the context, before its closing [SEP]; SQuAD answers are a few tokens long.
  start = jax.random.randint(start_rng, (n,), question, length - 1, jnp.int32)
  span = jax.random.randint(len_rng, (n,), 0, cfg['max_answer_len'], jnp.int32)
  end = jnp.minimum(start + span, length - 2)
  return {'tokens': tokens, 'segments': segments, 'start_positions': start, 'end_positions': end}


def squad_loss(cfg, outputs, batch):
  """(CE(start) + CE(end)) / 2, each averaged over the batch, as run_squad.py."""
  del cfg
  start_logits, end_logits = outputs
  start = cross_entropy(start_logits, batch['start_positions']).mean()
  end = cross_entropy(end_logits, batch['end_positions']).mean()
  return (start + end) / 2, {'start_loss': start, 'end_loss': end}


def squad_flops(cfg):
  length = cfg['seq_len']
  forward = length * (encoder_flops_per_token(cfg, length) + 2 * cfg['hidden'] * 2)
  return 3.0 * forward


# run_squad.py's README recipe: lr 3e-5, 2 epochs of ~88.6k features at batch 12, 10% warm-up.
BERT_SQUAD_CONFIG = dict(
  BERT_BASE_CONFIG,
  seq_len=384,
  question_len=64,
  max_answer_len=30,
  lr=3e-5,
  warmup=1477,
  total_steps=14774,
)
del BERT_SQUAD_CONFIG['masked']
BERT_SQUAD_TINY = dict(
  TINY_ENCODER,
  seq_len=24,
  question_len=8,
  max_answer_len=4,
  lr=1e-3,
  warmup=1,
  total_steps=1000,
)


def check_squad(cfg):
  question, length = cfg['question_len'], cfg['seq_len']
  return check_encoder(cfg) or wl.first(
    (
      question > length - 2,
      f'question_len ({question}) must be at most seq_len - 2 ({length - 2})',
    ),
  )


BERT_SQUAD = wl.Workload(
  name='bert_squad',
  description='BERT-base uncased SQuAD 1.1 fine-tuning at sequence length 384 (span head)',
  unit='sequences',
  throughput_unit='sequences/s',
  config=BERT_SQUAD_CONFIG,
  tiny=BERT_SQUAD_TINY,
  spec=ENCODER_SPEC,
  check=check_squad,
  trainer=wl.supervised(lambda cfg, dtype: BertSquad(cfg, dtype), squad_batch, squad_loss, adamw),
  flops_per_example=squad_flops,
  revision=10,
)
