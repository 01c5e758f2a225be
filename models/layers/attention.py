"""Multi-head attention with dropout on the attention probabilities as BERT and fairseq draw it."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

# What the backward pass gets of each layer's L x L arrays (the scores, the probabilities, the
# dropout mask): 'saved' keeps them from the forward pass, as the 2020 programs (TensorFlow's
# BERT, fairseq) did; 'recomputed' keeps only the queries, keys and values and computes the
# arrays again in the backward pass, as fused attention kernels (PyTorch's scaled_dot_product_
# attention) do. Same values, same random bits; less memory for one more QK^T product a layer.
PROBS = ('saved', 'recomputed')


def recomputed_attention(
  query,
  key,
  value,
  bias=None,
  mask=None,
  broadcast_dropout: bool = True,
  dropout_rng=None,
  dropout_rate: float = 0.0,
  deterministic: bool = False,
  dtype=None,
  precision=None,
  force_fp32_for_softmax: bool = False,
):
  """nn.dot_product_attention under jax.checkpoint: its backward pass recomputes the scores,
  the probabilities and the dropout mask (from the same key) instead of reading them saved.

  The parameters are named, not **kwargs: Flax's MultiHeadDotProductAttention passes only the
  keyword arguments that an attention_fn's signature names."""

  def attend(query, key, value, bias, mask, dropout_rng):
    return nn.dot_product_attention(
      query,
      key,
      value,
      bias,
      mask,
      broadcast_dropout=broadcast_dropout,
      dropout_rng=dropout_rng,
      dropout_rate=dropout_rate,
      deterministic=deterministic,
      dtype=dtype,
      precision=precision,
      force_fp32_for_softmax=force_fp32_for_softmax,
    )

  return jax.checkpoint(attend)(query, key, value, bias, mask, dropout_rng)


def multi_head(
  heads: int,
  dropout: float,
  train: bool,
  dtype: Any = jnp.float32,
  name=None,
  probs: str = 'saved',
):
  """Flax's multi-head dot-product attention with one dropout draw per probability.

  BERT (`dropout(attention_probs)` on [B, N, F, T]) and fairseq (`F.dropout` on
  [B*N, T, S]) drop each sequence's and each head's probabilities independently. Flax's
  default (`broadcast_dropout=True`) draws one L x L mask shared by the whole batch and every
  head: a different regulariser, and a mask B*N times smaller in memory. `probs` is one of
  PROBS.
  """
  if probs not in PROBS:
    raise ValueError(f'attention probs must be one of {", ".join(PROBS)}, got {probs!r}')
  return nn.MultiHeadDotProductAttention(
    num_heads=heads,
    dtype=dtype,
    dropout_rate=dropout,
    broadcast_dropout=False,
    deterministic=not train,
    attention_fn=recomputed_attention if probs == 'recomputed' else nn.dot_product_attention,
    name=name,
  )
