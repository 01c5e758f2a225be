"""Multi-head attention with dropout on the attention probabilities as BERT and fairseq draw it."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp


def multi_head(heads: int, dropout: float, train: bool, dtype: Any = jnp.float32, name=None):
  """Flax's multi-head dot-product attention with one dropout draw per probability.

  BERT (`dropout(attention_probs)` on [B, N, F, T]) and fairseq (`F.dropout` on
  [B*N, T, S]) drop each sequence's and each head's probabilities independently. Flax's
  default (`broadcast_dropout=True`) draws one L x L mask shared by the whole batch and every
  head: a different regulariser, and a mask B*N times smaller in memory.
  """
  return nn.MultiHeadDotProductAttention(
    num_heads=heads,
    dtype=dtype,
    dropout_rate=dropout,
    broadcast_dropout=False,
    deterministic=not train,
    name=name,
  )
