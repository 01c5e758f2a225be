"""ConvS2S (Gehring et al. 2017, "Convolutional Sequence to Sequence Learning"), fairseq fconv.

fairseq's fconv_wmt_en_de: gated convolutional encoder and causal decoder, weight-normalised
layers, multi-step attention in every decoder layer, learned positions.
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models import transformer
from models import workload as wl
from models.conv_seq2seq.conv_tbc import CONV_IMPLS, temporal_conv
from models.layers import embed as embed_layers

PAD = transformer.PAD  # synthetic sentences never draw it
EOS = 2
SQRT_HALF = math.sqrt(0.5)  # fairseq's normalization_constant 0.5: residual sums keep variance

# fairseq's fconv_wmt_en_de layer list: (channels, kernel width), the same for encoder and decoder.
WMT_EN_DE_LAYERS = ((512, 3),) * 9 + ((1024, 3),) * 4 + ((2048, 1),) * 2


class WeightNormDense(nn.Module):
  """A weight-normalised linear layer, w = g * v / ||v||, as torch's weight_norm(nn.Linear).

  Parameters v (in x out), g (one per output) and a bias; fairseq initialises v with
  std sqrt((1 - dropout) / in) and g to ||v||, so that w = v at the start.
  """

  features: int
  dropout: float = 0.0  # only scales the initialisation, as fairseq's Linear(dropout=...)
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    fan_in = x.shape[-1]
    std = math.sqrt((1.0 - self.dropout) / fan_in)
    v = self.param('v', nn.initializers.normal(std), (fan_in, self.features))
    g = self.param('g', lambda _: jnp.linalg.norm(v, axis=0))
    b = self.param('bias', nn.initializers.zeros, (self.features,))
    w = v * (g / jnp.linalg.norm(v, axis=0))
    return jnp.dot(x.astype(self.dtype), w.astype(self.dtype)) + b.astype(self.dtype)


class WeightNormConv1d(nn.Module):
  """A weight-normalised temporal convolution (fairseq's ConvTBC / LinearizedConvolution).

  The norm is per output channel (weight_norm dim=2 on a K x Cin x Cout kernel). `causal`
  pads K-1 steps on the left only, so output t sees inputs <= t (fairseq pads K-1 on both
  sides and drops the last K-1 outputs, which is the same); otherwise K//2 on each side.

  Computed as fairseq's ConvTBC computes it, with matrix products rather than a convolution
  kernel (`temporal_conv`): the FLOPs are the convolution's, the backward pass keeps only the
  input and the kernel, and XLA hands cuBLAS GEMMs instead of cuDNN convolutions (whose
  autotuning takes minutes per compile at large batches on an H200).
  """

  features: int
  kernel: int
  causal: bool = False
  dropout: float = 0.0  # only scales the initialisation
  impl: str = 'gemm'  # see temporal_conv
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxLxC):
    k, cin = self.kernel, x_BxLxC.shape[-1]
    std = math.sqrt(4.0 * (1.0 - self.dropout) / (k * cin))  # GLU halves the variance
    v = self.param('v', nn.initializers.normal(std), (k, cin, self.features))
    g = self.param('g', lambda _: jnp.linalg.norm(v, axis=(0, 1)))
    b = self.param('bias', nn.initializers.zeros, (self.features,))
    w_KxCxD = v * (g / jnp.linalg.norm(v, axis=(0, 1)))
    x_BxLxC, w_KxCxD = x_BxLxC.astype(self.dtype), w_KxCxD.astype(self.dtype)
    return temporal_conv(x_BxLxC, w_KxCxD, self.causal, self.impl) + b.astype(self.dtype)


@jax.custom_vjp
def _grad_multiply(x, scale):
  return x


def _grad_multiply_fwd(x, scale):
  return x, scale


def _grad_multiply_bwd(scale, grad):
  return grad * scale.astype(grad.dtype), jnp.zeros_like(scale)


_grad_multiply.defvjp(_grad_multiply_fwd, _grad_multiply_bwd)


def grad_multiply(x, scale):
  """Identity forward; multiplies the gradient by `scale` (fairseq's GradMultiply)."""
  return _grad_multiply(x, jnp.asarray(scale, jnp.float32))


class ConvStack(nn.Module):
  """The gated convolution blocks shared by encoder and decoder.

  Each block: dropout, convolution to 2C, GLU, [attention], then (x + residual) * sqrt(0.5);
  the residual is projected where the width changes. With `attention_dim` each block
  attends to the encoder after its GLU (the decoder).
  """

  layers: tuple
  dropout: float
  causal: bool
  attention_dim: int = 0  # > 0: a fairseq AttentionLayer in every block, to this embedding width
  conv_impl: str = 'gemm'
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train, valid_BxL=None, target_embedding=None, encoder_out=None):
    drop = nn.Dropout(self.dropout, deterministic=not train)
    channels = self.layers[0][0]
    for i, (out, kernel) in enumerate(self.layers):
      residual = x
      if channels != out:
        residual = WeightNormDense(out, dtype=self.dtype, name=f'projection_{i}')(x)
      if valid_BxL is not None:  # the encoder zeroes padded steps before every convolution
        x = jnp.where(valid_BxL[..., None], x, 0)
      x = WeightNormConv1d(
        2 * out,
        kernel,
        causal=self.causal,
        dropout=self.dropout,
        impl=self.conv_impl,
        dtype=self.dtype,
        name=f'conv_{i}',
      )(drop(x))
      x = nn.glu(x, axis=-1)
      if self.attention_dim:
        x = Attention(self.attention_dim, dtype=self.dtype, name=f'attention_{i}')(
          x, target_embedding, *encoder_out
        )
      x = (x + residual) * SQRT_HALF
      channels = out
    return x


class Attention(nn.Module):
  """fairseq's AttentionLayer: one-head dot-product attention from a decoder block.

  Queries are in_projection(x) plus the target embedding (scaled by sqrt(0.5)); keys are the
  encoder outputs, values the encoder outputs plus the source embedding. The context is
  scaled by sqrt(source length), projected back and added to x (again scaled by sqrt(0.5)).
  """

  embed_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxTxC, target_embedding_BxTxE, keys_BxSxE, values_BxSxE, src_valid_BxS):
    q = (
      WeightNormDense(self.embed_dim, dtype=self.dtype, name='in_projection')(x_BxTxC)
      + target_embedding_BxTxE
    ) * SQRT_HALF
    scores_BxTxS = jnp.einsum('bte,bse->bts', q, keys_BxSxE).astype(jnp.float32)
    scores_BxTxS = jnp.where(src_valid_BxS[:, None, :], scores_BxTxS, -jnp.inf)
    probs = jax.nn.softmax(scores_BxTxS, axis=-1).astype(self.dtype)
    context = jnp.einsum('bts,bse->bte', probs, values_BxSxE)
    src_len = src_valid_BxS.sum(axis=1).astype(jnp.float32)
    context = context * jnp.sqrt(src_len).astype(self.dtype)[:, None, None]  # s * sqrt(1/s)
    y = WeightNormDense(x_BxTxC.shape[-1], dtype=self.dtype, name='out_projection')(context)
    return (y + x_BxTxC) * SQRT_HALF


class Embeddings(nn.Module):
  """Token plus learned position embeddings, both N(0, 0.1) as fairseq initialises them.

  Positions count from PAD + 1 and padded tokens take position PAD, as fairseq's
  make_positions does; the table has max_positions rows.
  """

  vocab: int
  dim: int
  max_positions: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens_BxL):
    init = nn.initializers.normal(0.1)
    valid = tokens_BxL != PAD
    positions = jnp.where(valid, jnp.arange(tokens_BxL.shape[1]) + PAD + 1, PAD)
    tokens = embed_layers.Embed(
      self.vocab, self.dim, embedding_init=init, dtype=self.dtype, name='tokens'
    )(tokens_BxL)
    return tokens + embed_layers.Embed(
      self.max_positions, self.dim, embedding_init=init, dtype=self.dtype, name='positions'
    )(positions)


class FConv(nn.Module):
  """fairseq's FConvModel: convolutional encoder, causal convolutional decoder with attention."""

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch, train):
    cfg = self.cfg
    e, p = cfg['embed_dim'], cfg['dropout']
    layers = tuple(tuple(layer) for layer in cfg['layers'])
    drop = nn.Dropout(p, deterministic=not train)
    dense = lambda features, name, dropout=0.0: WeightNormDense(
      features, dropout=dropout, dtype=self.dtype, name=name
    )

    src_BxS, tgt_in_BxT = batch['source'], batch['target_in']
    src_valid = src_BxS != PAD
    # Encoder.
    src_embedding = drop(
      Embeddings(cfg['src_vocab'], e, cfg['max_positions'], self.dtype, name='encoder_embed')(
        src_BxS
      )
    )
    x = dense(layers[0][0], 'encoder_fc1', p)(src_embedding)
    x = ConvStack(
      layers, p, causal=False, conv_impl=cfg['conv_impl'], dtype=self.dtype, name='encoder'
    )(x, train, src_valid)
    x = dense(e, 'encoder_fc2')(x)
    x = jnp.where(src_valid[..., None], x, 0)
    # Every decoder layer attends to the encoder: fairseq scales the gradients reaching the
    # encoder by 1 / (2 * number of attention layers) so they do not grow with depth.
    keys_BxSxE = grad_multiply(x, 1.0 / (2.0 * len(layers)))
    values_BxSxE = (keys_BxSxE + src_embedding) * SQRT_HALF
    # Decoder.
    tgt_embedding = drop(
      Embeddings(cfg['tgt_vocab'], e, cfg['max_positions'], self.dtype, name='decoder_embed')(
        tgt_in_BxT
      )
    )
    y = dense(layers[0][0], 'decoder_fc1', p)(tgt_embedding)
    y = ConvStack(
      layers,
      p,
      causal=True,
      attention_dim=e,
      conv_impl=cfg['conv_impl'],
      dtype=self.dtype,
      name='decoder',
    )(y, train, target_embedding=tgt_embedding, encoder_out=(keys_BxSxE, values_BxSxE, src_valid))
    y = drop(dense(cfg['decoder_out_embed_dim'], 'decoder_fc2')(y))
    return dense(cfg['tgt_vocab'], 'decoder_fc3', p)(y)  # logits_BxTxV


def make_batch(cfg, rng, n):
  """n sentence pairs of fixed length over separate source and target vocabularies."""
  src_rng, tgt_rng = jax.random.split(rng)
  source = jax.random.randint(src_rng, (n, cfg['src_len']), PAD + 1, cfg['src_vocab'], jnp.int32)
  target = jax.random.randint(tgt_rng, (n, cfg['tgt_len']), PAD + 1, cfg['tgt_vocab'], jnp.int32)
  eos = jnp.full((n, 1), EOS, jnp.int32)  # decoder input starts with EOS, as fairseq's
  return {
    'source': source,
    'target_in': jnp.concatenate([eos, target[:, :-1]], axis=1),
    'target': target,
  }


def loss(cfg, logits, batch):
  value, nll = transformer.label_smoothed_nll(
    logits, batch['target'], cfg['label_smoothing'], (batch['target'] != PAD).astype(jnp.float32)
  )
  return value, {'nll': nll}


def optimizer(cfg):
  """fairseq's nag (Nesterov momentum, fixed lr) after clipping the global gradient norm.

  fairseq's NAG update p += m^2 * buf - (1 + m) * lr * g, buf = m * buf - lr * g equals
  optax's Nesterov SGD at a constant learning rate.
  """
  return optax.chain(
    optax.clip_by_global_norm(cfg['clip_norm']),
    optax.sgd(cfg['lr'], momentum=cfg['momentum'], nesterov=True),
  )


def flops_per_example(cfg):
  """Training FLOPs of one sentence pair: 3x the forward matmuls and convolutions."""
  e, s, t = cfg['embed_dim'], cfg['src_len'], cfg['tgt_len']
  layers = tuple(tuple(layer) for layer in cfg['layers'])
  first, last = layers[0][0], layers[-1][0]
  enc_token = 2 * e * first + 2 * last * e  # fc1, fc2
  dec_token = (
    2 * e * first
    + 2 * last * cfg['decoder_out_embed_dim']
    + 2 * cfg['decoder_out_embed_dim'] * cfg['tgt_vocab']
  )  # fc1, fc2, fc3
  channels = first
  for out, kernel in layers:
    block = 2 * kernel * channels * 2 * out + (2 * channels * out if channels != out else 0)
    enc_token += block
    # Attention: in/out projections, scores over and weighted sum of the S source steps.
    dec_token += block + 4 * out * e + 4 * s * e
    channels = out
  return 3.0 * (s * enc_token + t * dec_token)


def check(cfg):
  """A position embedding for every token (positions count from PAD + 1)."""
  length, positions = max(cfg['src_len'], cfg['tgt_len']), cfg['max_positions']
  return wl.first(
    (
      length + PAD >= positions,
      f'src_len and tgt_len must be less than max_positions ({positions})',
    ),
  )


FCONV_WMT_EN_DE = wl.Workload(
  name='conv_seq2seq',
  description='ConvS2S (fairseq fconv_wmt_en_de), WMT14 en-de, FP32',
  unit='tokens',
  throughput_unit='target tokens/s',
  config=dict(
    # The dictionaries of fairseq's pretrained wmt14.en-de.fconv-py model: 40k joint BPE
    # merges, binarised into separate English and German dictionaries.
    src_vocab=42243,
    tgt_vocab=43676,
    embed_dim=768,
    decoder_out_embed_dim=512,
    layers=WMT_EN_DE_LAYERS,
    max_positions=1024,  # fairseq's max_source_positions / max_target_positions
    dropout=0.2,
    label_smoothing=0.1,
    lr=0.5,
    momentum=0.99,
    clip_norm=0.1,
    # Fixed sentence lengths, as transformer_big (see README "transformer_big").
    src_len=30,
    tgt_len=30,
    # How the convolutions are computed (models/conv_seq2seq/conv_tbc.py): the same model and
    # FLOPs, different kernels and memory. 'gemm' is fairseq's ConvTBC way; 'xla' is cuDNN's
    # convolution.
    conv_impl='gemm',
  ),
  tiny=dict(
    src_vocab=64,
    tgt_vocab=96,
    embed_dim=32,
    decoder_out_embed_dim=16,
    layers=((16, 3), (16, 3), (32, 3), (64, 1)),
    max_positions=16,
    src_len=8,
    tgt_len=8,
    dropout=0.1,
  ),
  trainer=wl.supervised(lambda cfg, dtype: FConv(cfg, dtype), make_batch, loss, optimizer),
  # 2: the convolution keeps only its input and kernel for the backward pass (a custom VJP).
  revision=5,
  # fairseq's --required-batch-size-multiple (8), as transformer_big.
  batch_multiple=8,
  spec=dict(
    src_vocab=wl.Key(lo=EOS + 1),
    tgt_vocab=wl.Key(lo=EOS + 1),
    layers=wl.Key(sized=False),  # (width, kernel) per convolution
    dropout=wl.FRACTION,
    label_smoothing=wl.FRACTION,
    conv_impl=wl.Key(choices=CONV_IMPLS),
  ),
  check=check,
  flops_per_example=flops_per_example,
  # max_tokens counts padded tokens of the longer side: sentences x max(S, T).
  example_size=lambda cfg: max(cfg['src_len'], cfg['tgt_len']),
  units_per_example=lambda cfg: cfg['tgt_len'],
)
