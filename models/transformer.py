"""Transformer Big (Vaswani et al. 2017), as fairseq's transformer_vaswani_wmt_en_de_big."""

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models import workload as wl
from models.layers import attention as attention_layers
from models.layers import cross_entropy as cross_entropy_layers
from models.layers import dropout as dropout_layers
from models.layers import embed as embed_layers

PAD = 0  # token id of padding; synthetic sentences never draw it


class FeedForward(nn.Module):
  """Position-wise feed-forward block: dense, activation, dense."""

  hidden: int
  activation: Callable[[jax.Array], jax.Array]
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    y = nn.Dense(self.hidden, dtype=self.dtype, name='fc1')(x)
    return nn.Dense(x.shape[-1], dtype=self.dtype, name='fc2')(self.activation(y))


class PostLNLayer(nn.Module):
  """A post-layer-norm transformer layer: self-attention, optional cross-attention, FFN.

  Each sub-block is x = LayerNorm(x + Dropout(sublayer(x))), as in the original
  Transformer, fairseq's default (normalize_before=False), BERT and XLM.
  """

  heads: int
  ffn: int
  dropout: float
  attention_dropout: float = 0.0
  activation: Callable[[jax.Array], jax.Array] = nn.relu
  cross_attention: bool = False
  ln_eps: float = 1e-5
  attention_probs: str = 'saved'  # attention_layers.PROBS
  projections: str = 'joined'  # attention_layers.PROJECTIONS
  dropout_draw: str = 'bernoulli'  # dropout_layers.DRAWS, of the sub-blocks' dropout
  dtype: Any = jnp.float32

  def _attend(self, name, q_in, kv_in, mask, train):
    attention = attention_layers.multi_head(
      self.heads,
      self.attention_dropout,
      train,
      self.dtype,
      name=name,
      probs=self.attention_probs,
      projections=self.projections,
    )
    return attention(q_in, kv_in, mask=mask)

  @nn.compact
  def __call__(self, x, self_mask, train, memory=None, memory_mask=None):
    drop = lambda y: dropout_layers.layer(self.dropout, self.dropout_draw, not train)(y)
    norm = lambda name: nn.LayerNorm(epsilon=self.ln_eps, dtype=self.dtype, name=name)
    x = norm('self_attention_norm')(
      x + drop(self._attend('self_attention', x, x, self_mask, train))
    )
    if self.cross_attention:
      y = self._attend('cross_attention', x, memory, memory_mask, train)
      x = norm('cross_attention_norm')(x + drop(y))
    y = FeedForward(self.ffn, self.activation, dtype=self.dtype, name='ffn')(x)
    return norm('ffn_norm')(x + drop(y))


def sinusoidal_positions(length: int, dim: int) -> jax.Array:
  """fairseq's sinusoidal embedding: sines in the first half, cosines in the second."""
  half = dim // 2
  inv_freq = jnp.exp(jnp.arange(half, dtype=jnp.float32) * -(math.log(10000.0) / (half - 1)))
  angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=1)


class TransformerBig(nn.Module):
  """Encoder-decoder with source, target and output embeddings shared."""

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch, train):
    cfg = self.cfg
    d = cfg['d_model']
    embed = embed_layers.Embed(
      cfg['vocab'],
      d,
      embedding_init=nn.initializers.normal(d**-0.5),
      dtype=self.dtype,
      name='shared_embedding',
    )
    drop = dropout_layers.layer(cfg['dropout'], cfg['dropout_draw'], not train)
    layer = functools.partial(
      PostLNLayer,
      heads=cfg['heads'],
      ffn=cfg['ffn'],
      dropout=cfg['dropout'],
      attention_probs=cfg['attention_probs'],
      projections=cfg['projections'],
      dropout_draw=cfg['dropout_draw'],
      dtype=self.dtype,
    )

    def embed_tokens(tokens_BxL):
      x = embed(tokens_BxL) * math.sqrt(d)  # fairseq scales token embeddings by sqrt(d)
      x = x + sinusoidal_positions(tokens_BxL.shape[1], d)[None]
      return drop(x.astype(self.dtype))

    src_BxS, tgt_in_BxT = batch['source'], batch['target_in']
    src_valid = src_BxS != PAD
    enc_mask = nn.make_attention_mask(src_valid, src_valid)
    x = embed_tokens(src_BxS)
    for i in range(cfg['encoder_layers']):
      x = layer(name=f'encoder_{i}')(x, enc_mask, train)
    memory_BxSxD = x

    tgt_valid = tgt_in_BxT != PAD
    dec_mask = nn.combine_masks(
      nn.make_attention_mask(tgt_valid, tgt_valid), nn.make_causal_mask(tgt_in_BxT)
    )
    cross_mask = nn.make_attention_mask(tgt_valid, src_valid)
    y = embed_tokens(tgt_in_BxT)
    for i in range(cfg['decoder_layers']):
      y = layer(name=f'decoder_{i}', cross_attention=True)(
        y, dec_mask, train, memory=memory_BxSxD, memory_mask=cross_mask
      )
    return embed.attend(y)  # logits_BxTxV through the shared embedding


def label_smoothed_nll(logits_BxTxV, targets_BxT, epsilon, weights_BxT=None):
  """fairseq's label_smoothed_cross_entropy: (1-eps)*nll + eps/V * sum(-log p), per token; the
  weighted means of it and of the nll."""
  per_token, nll = cross_entropy_layers.token_losses(logits_BxTxV, targets_BxT, epsilon)
  if weights_BxT is None:
    weights_BxT = jnp.ones_like(per_token)
  denom = jnp.maximum(weights_BxT.sum(), 1.0)
  return (per_token * weights_BxT).sum() / denom, (nll * weights_BxT).sum() / denom


def make_batch(cfg, rng, n):
  """n sentence pairs of fixed length; tokens avoid PAD so every position counts."""
  src_rng, tgt_rng = jax.random.split(rng)
  source = jax.random.randint(src_rng, (n, cfg['src_len']), 1, cfg['vocab'], jnp.int32)
  target = jax.random.randint(tgt_rng, (n, cfg['tgt_len']), 1, cfg['vocab'], jnp.int32)
  eos = jnp.full((n, 1), 2, jnp.int32)  # decoder input starts with EOS, as fairseq's
  return {
    'source': source,
    'target_in': jnp.concatenate([eos, target[:, :-1]], axis=1),
    'target': target,
  }


def loss(cfg, logits, batch):
  value, nll = label_smoothed_nll(
    logits, batch['target'], cfg['label_smoothing'], (batch['target'] != PAD).astype(jnp.float32)
  )
  return value, {'nll': nll}


def inverse_sqrt(lr, warmup, warmup_init_lr=1e-7):
  """fairseq's inverse_sqrt schedule: linear warm-up, then lr * sqrt(warmup / step)."""

  def schedule(step):
    step = step + 1
    warm = warmup_init_lr + (lr - warmup_init_lr) * step / warmup
    return jnp.where(step < warmup, warm, lr * jnp.sqrt(warmup / step))

  return schedule


def optimizer(cfg):
  return optax.adam(inverse_sqrt(cfg['lr'], cfg['warmup']), b1=0.9, b2=0.98, eps=1e-8)


# fairseq's fp16 loss scale on one GPU: --fp16-init-scale 2**7, and --fp16-scale-window unset,
# which FP16Optimizer makes 2**14 / (GPUs x update_freq) updates between doublings.
FAIRSEQ_LOSS_SCALE = dict(init=2.0**7, window=2**14)


def trainer(cfg, policy):
  """The supervised trainer, under fairseq's loss scale where the policy scales the loss."""
  return wl.supervised(lambda cfg, dtype: TransformerBig(cfg, dtype), make_batch, loss, optimizer)(
    cfg, policy.with_loss_scale(**FAIRSEQ_LOSS_SCALE)
  )


def flops_per_example(cfg):
  """Training FLOPs of one sentence pair: 3x the forward matmuls (backward is 2x)."""
  d, f, v = cfg['d_model'], cfg['ffn'], cfg['vocab']
  s, t = cfg['src_len'], cfg['tgt_len']
  enc_token = 8 * d * d + 4 * d * f + 4 * s * d  # QKVO, FFN, scores and weighted sum
  dec_token = (8 * d * d + 4 * t * d) + (4 * d * d + 4 * s * d) + 4 * d * f + 2 * d * v
  cross_kv_per_src_token = 4 * d * d
  forward = (
    cfg['encoder_layers'] * s * enc_token
    + cfg['decoder_layers'] * (t * (dec_token - 2 * d * v) + s * cross_kv_per_src_token)
    + t * 2 * d * v
  )
  return 3.0 * forward


def check(cfg):
  """Whole heads, and sinusoidal positions of an even width (sines, then cosines)."""
  d, heads = cfg['d_model'], cfg['heads']
  return wl.first(
    (d % heads != 0, f'heads ({heads}) must divide d_model ({d})'),
    (d % 2 != 0 or d < 4, f'd_model ({d}) must be even and at least 4'),
  )


TRANSFORMER_BIG = wl.Workload(
  name='transformer_big',
  description='Transformer Big (fairseq transformer_vaswani_wmt_en_de_big), WMT en-de, FP16',
  unit='tokens',
  throughput_unit='target tokens/s',
  config=dict(
    vocab=32768,  # fairseq's joint en-de BPE dictionary, shared by all embeddings
    d_model=1024,
    ffn=4096,
    heads=16,
    encoder_layers=6,
    decoder_layers=6,
    dropout=0.3,
    attention_probs='auto',  # models/layers/attention.PROBS: saved under tf32 at 30 tokens
    projections='joined',  # models/layers/attention.PROJECTIONS
    dropout_draw='grouped',  # models/layers/dropout.DRAWS: four keep decisions a hash
    label_smoothing=0.1,
    lr=1e-3,
    warmup=4000,
    # Fixed sentence length. The mean BPE'd WMT en-de sentence (end-of-sentence
    # included) is near 30 tokens; see README "transformer_big".
    src_len=30,
    tgt_len=30,
  ),
  tiny=dict(
    vocab=96,
    d_model=32,
    ffn=64,
    heads=4,
    encoder_layers=2,
    decoder_layers=2,
    lr=3e-3,
    warmup=1,
    src_len=8,
    tgt_len=8,
    dropout=0.1,
  ),
  spec=dict(
    vocab=wl.Key(lo=2),
    dropout=wl.FRACTION,
    label_smoothing=wl.FRACTION,
    attention_probs=wl.Key(choices=attention_layers.PROBS),
    projections=wl.Key(choices=attention_layers.PROJECTIONS),
    dropout_draw=wl.Key(choices=dropout_layers.DRAWS),
  ),
  check=check,
  trainer=trainer,
  flops_per_example=flops_per_example,
  # max_tokens counts padded tokens of the longer side: sentences x max(S, T).
  example_size=lambda cfg: max(cfg['src_len'], cfg['tgt_len']),
  units_per_example=lambda cfg: cfg['tgt_len'],
  default_precision='fp16',
  # fairseq's --required-batch-size-multiple (8): sentences in multiples of 8. Also what the
  # tensor cores want: at 30 tokens a sentence, another count pads every fp16 and bf16 matrix
  # product's token dimension to a multiple of 8 (XLA's cuBLAS padding), a copy of each operand.
  batch_multiple=8,
  revision=8,
)
