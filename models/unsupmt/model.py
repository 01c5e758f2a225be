"""The XLM encoder-decoder (Lample & Conneau 2019), as facebookresearch/XLM's TransformerModel.

Post-LN layers with GELU, learned position and language embeddings, LayerNorm on the
embedding sum, hidden states zeroed on padding. The encoder and the decoder have
their own embeddings; the decoder's output projection is its input embedding plus a
bias (share_inout_emb). The decoder also runs one token at a time over a KV cache
of fixed length, for greedy generation inside a compiled loop.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import transformer
from models.layers import embed as embed_layers
from models.layers import gelu as gelu_layers
from models.unsupmt.noise import PAD

LN_EPS = 1e-12  # XLM's LayerNorm epsilon
gelu = gelu_layers.gelu  # XLM's erf GELU, keeping only its input for the backward pass


class Attention(nn.Module):
  """XLM's MultiHeadAttention: q/k/v/out projections, dropout on the weights."""

  dim: int
  heads: int
  dropout: float
  dtype: Any = jnp.float32

  def setup(self):
    dense = functools.partial(nn.Dense, self.dim, dtype=self.dtype)
    self.q_lin, self.k_lin, self.v_lin, self.out_lin = (
      dense(name=n) for n in ('q_lin', 'k_lin', 'v_lin', 'out_lin')
    )
    self.weights_dropout = nn.Dropout(self.dropout)

  def _split(self, x_BxLxD):
    return x_BxLxD.reshape(*x_BxLxD.shape[:2], self.heads, self.dim // self.heads)

  def kv(self, x_BxKxD):
    """Keys and values, BxKxHxDh: computed once per source, or one step at a time."""
    return self._split(self.k_lin(x_BxKxD)), self._split(self.v_lin(x_BxKxD))

  def __call__(self, x_BxQxD, k_BxKxHxDh, v_BxKxHxDh, mask_Bx1xQxK, train):
    q = self._split(self.q_lin(x_BxQxD)) * (self.dim // self.heads) ** -0.5
    scores = jnp.einsum('bqhd,bkhd->bhqk', q, k_BxKxHxDh).astype(jnp.float32)
    scores = jnp.where(mask_Bx1xQxK, scores, jnp.finfo(jnp.float32).min)
    # XLM takes the softmax in float32 whatever the compute dtype.
    weights = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    weights = self.weights_dropout(weights, deterministic=not train)
    context = jnp.einsum('bhqk,bkhd->bqhd', weights, v_BxKxHxDh)
    return self.out_lin(context.reshape(*context.shape[:2], self.dim))


class Layer(nn.Module):
  """One post-LN layer: self-attention, cross-attention (decoder), FFN."""

  cfg: Any
  cross: bool
  dtype: Any = jnp.float32

  def setup(self):
    cfg = self.cfg
    attention = functools.partial(
      Attention, cfg['d_model'], cfg['heads'], cfg['attention_dropout'], self.dtype
    )
    norm = functools.partial(nn.LayerNorm, epsilon=LN_EPS, dtype=self.dtype)
    self.attention, self.layer_norm1 = attention(), norm()
    if self.cross:
      self.encoder_attn, self.layer_norm15 = attention(), norm()
    self.ffn = transformer.FeedForward(cfg['ffn'], gelu, dtype=self.dtype)
    self.layer_norm2 = norm()
    self.dropout = nn.Dropout(cfg['dropout'])

  def memory_kv(self, memory_BxSxD):
    return self.encoder_attn.kv(memory_BxSxD)

  def __call__(self, x, mask, train, cache=None, index=None, cross=None):
    """cache: this layer's (k, v) of fixed length, filled at `index` with x's keys."""
    drop = lambda y: self.dropout(y, deterministic=not train)
    k, v = self.attention.kv(x)
    if cache is not None:
      k = jax.lax.dynamic_update_slice_in_dim(cache[0], k.astype(cache[0].dtype), index, axis=1)
      v = jax.lax.dynamic_update_slice_in_dim(cache[1], v.astype(cache[1].dtype), index, axis=1)
      cache = (k, v)
    x = self.layer_norm1(x + drop(self.attention(x, k, v, mask, train)))
    if cross is not None:
      memory_k, memory_v, memory_mask = cross
      x = self.layer_norm15(x + drop(self.encoder_attn(x, memory_k, memory_v, memory_mask, train)))
    x = self.layer_norm2(x + drop(self.ffn(x)))
    return x, cache


class Transformer(nn.Module):
  """XLM's TransformerModel: the encoder, or the decoder with its output layer."""

  cfg: Any
  is_decoder: bool
  dtype: Any = jnp.float32

  def setup(self):
    cfg = self.cfg
    d = cfg['d_model']
    embed = functools.partial(
      embed_layers.Embed,
      features=d,
      dtype=self.dtype,
      embedding_init=nn.initializers.normal(d**-0.5),
    )
    self.embeddings = embed(cfg['vocab'])
    self.position_embeddings = embed(cfg['max_positions'])
    self.lang_embeddings = embed(cfg['n_langs'])
    self.layer_norm_emb = nn.LayerNorm(epsilon=LN_EPS, dtype=self.dtype)
    self.dropout = nn.Dropout(cfg['dropout'])
    self.layers = [
      Layer(cfg, self.is_decoder, self.dtype, name=f'layer_{i}') for i in range(cfg['layers'])
    ]
    if self.is_decoder:
      self.pred_bias = self.param('pred_bias', nn.initializers.zeros, (cfg['vocab'],))

  def _embed(self, tokens_BxL, positions, lang, train):
    x = (
      self.embeddings(tokens_BxL)
      + self.position_embeddings(positions)
      + self.lang_embeddings(jnp.asarray(lang, jnp.int32))
    )
    return self.dropout(self.layer_norm_emb(x), deterministic=not train)

  def encode(self, tokens_BxS, lang, train):
    valid = (tokens_BxS != PAD)[..., None].astype(self.dtype)
    x = self._embed(tokens_BxS, jnp.arange(tokens_BxS.shape[1])[None], lang, train) * valid
    mask = (tokens_BxS != PAD)[:, None, None, :]
    for layer in self.layers:
      x = layer(x, mask, train)[0] * valid
    return x

  def memory_kv(self, memory_BxSxD):
    return [layer.memory_kv(memory_BxSxD) for layer in self.layers]

  def decode(self, tokens_BxT, lang, memory_BxSxD, src_valid_BxS, train):
    """Teacher-forced logits, BxTxV."""
    length = tokens_BxT.shape[1]
    valid = (tokens_BxT != PAD)[..., None].astype(self.dtype)
    x = self._embed(tokens_BxT, jnp.arange(length)[None], lang, train) * valid
    # XLM's causal mask ignores target padding: padded rows are zeroed after each layer.
    mask = jnp.tril(jnp.ones((length, length), bool))[None, None]
    memory_mask = src_valid_BxS[:, None, None, :]
    for layer in self.layers:
      k, v = layer.memory_kv(memory_BxSxD)
      x = layer(x, mask, train, cross=(k, v, memory_mask))[0] * valid
    return self.logits(x)

  def decode_step(self, token_Bx1, index, lang, cache, memory_kv, src_valid_BxS):
    """The next-token logits (BxV) of position `index`, and the updated cache."""
    x = self._embed(token_Bx1, jnp.full((1, 1), index), lang, train=False)
    mask = (jnp.arange(cache[0][0].shape[1]) <= index)[None, None, None, :]
    memory_mask = src_valid_BxS[:, None, None, :]
    new_cache = []
    for layer, layer_cache, (k, v) in zip(self.layers, cache, memory_kv):
      x, layer_cache = layer(
        x, mask, False, cache=layer_cache, index=index, cross=(k, v, memory_mask)
      )
      new_cache.append(layer_cache)
    return self.logits(x)[:, 0], new_cache

  def logits(self, x_BxTxD):
    return self.embeddings.attend(x_BxTxD) + self.pred_bias.astype(self.dtype)


class EncoderDecoder(nn.Module):
  """The MT model: an encoder and a decoder with separate parameters, as XLM builds them."""

  cfg: Any
  dtype: Any = jnp.float32

  def setup(self):
    self.encoder = Transformer(self.cfg, is_decoder=False, dtype=self.dtype)
    self.decoder = Transformer(self.cfg, is_decoder=True, dtype=self.dtype)

  def __call__(self, src_BxS, src_lang, tgt_in_BxT, tgt_lang, train):
    """Teacher-forced logits of the target given the source."""
    memory = self.encoder.encode(src_BxS, src_lang, train)
    return self.decoder.decode(tgt_in_BxT, tgt_lang, memory, src_BxS != PAD, train)

  def encode(self, src_BxS, src_lang, train):
    return self.encoder.encode(src_BxS, src_lang, train)

  def memory_kv(self, memory_BxSxD):
    return self.decoder.memory_kv(memory_BxSxD)

  def decode_step(self, token_Bx1, index, lang, cache, memory_kv, src_valid_BxS):
    return self.decoder.decode_step(token_Bx1, index, lang, cache, memory_kv, src_valid_BxS)
