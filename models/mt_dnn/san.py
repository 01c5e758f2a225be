"""SAN answer module (Liu, Duh & Gao 2018): GRU reasoning over bilinear attention turns."""

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

head_init = nn.initializers.normal(0.02)  # MT-DNN's _my_init: N(0, 0.02) weights, zero biases


def torch_uniform(fan):
  """PyTorch's default RNN-cell init, U(-1/sqrt(hidden), 1/sqrt(hidden)); _my_init skips GRUs."""
  bound = 1.0 / math.sqrt(fan)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


class GRUCell(nn.Module):
  """torch.nn.GRUCell: reset, update and candidate gates, biases on input and hidden sides."""

  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxH, h_BxH):
    init = torch_uniform(self.features)
    dense = functools.partial(
      nn.Dense, 3 * self.features, kernel_init=init, bias_init=init, dtype=self.dtype
    )
    i_r, i_z, i_n = jnp.split(dense(name='input')(x_BxH), 3, axis=-1)
    h_r, h_z, h_n = jnp.split(dense(name='hidden')(h_BxH), 3, axis=-1)
    r = nn.sigmoid(i_r + h_r)
    z = nn.sigmoid(i_z + h_z)
    n = jnp.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h_BxH


def masked_softmax(scores_BxL, valid_BxL):
  """Softmax over valid positions, in float32 (the reference fills the rest with -inf)."""
  scores = jnp.where(valid_BxL, scores_BxL.astype(jnp.float32), -jnp.inf)
  return jax.nn.softmax(scores, axis=-1)


def sequence_dropout_mask(rate, batch, features, train, dtype):
  """MT-DNN's variational dropout mask, one per sequence and shared by its positions.

  Since (x * m) @ w = x @ (m * w), callers scale a vector with it instead of masking the
  B x L x H memory.
  """
  return nn.Dropout(rate, deterministic=not train)(jnp.ones((batch, features), dtype))


class SanTurn(nn.Module):
  """One SAN reasoning step: attend the memory with the state, score, advance the GRU."""

  classes: int
  dropout: float
  train: bool
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, s_BxH, hidden_BxLxH, second_BxL):
    batch, _, h = hidden_BxLxH.shape
    drop = nn.Dropout(self.dropout, deterministic=not self.train)
    # Bilinear attention x_l' W s over the second segment (dropout on both sides).
    wy_BxH = nn.Dense(h, kernel_init=head_init, dtype=self.dtype, name='bilinear')(drop(s_BxH))
    wy_BxH = wy_BxH * sequence_dropout_mask(self.dropout, batch, h, self.train, self.dtype)
    att_BxL = masked_softmax(jnp.einsum('blh,bh->bl', hidden_BxLxH, wy_BxH), second_BxL)
    x_sum_BxH = jnp.einsum('bl,blh->bh', att_BxL.astype(self.dtype), hidden_BxLxH)
    features = jnp.concatenate(
      [x_sum_BxH, s_BxH, jnp.abs(x_sum_BxH - s_BxH), x_sum_BxH * s_BxH], axis=-1
    )
    logits_BxC = nn.Dense(self.classes, kernel_init=head_init, dtype=self.dtype, name='classifier')(
      drop(features)
    )
    s_BxH = GRUCell(h, self.dtype, name='gru')(x_sum_BxH, drop(s_BxH))
    return s_BxH, logits_BxC.astype(jnp.float32)


class SanClassifier(nn.Module):
  """SAN answer module: a GRU state reads the second segment for `turns` steps.

  The initial state is a linear self-attention summary of the first segment; each turn a
  bilinear attention of the state over the second segment gives x_sum, the turn's logits come
  from [x_sum, s, |x_sum - s|, x_sum * s], and the GRU takes x_sum to the next state. Training
  averages the turns' probabilities under stochastic prediction dropout (answer_mem_type 1).
  Returns log-probabilities, which MT-DNN feeds to cross-entropy as logits.
  """

  classes: int
  dropout: float
  turns: int = 5
  mem_drop: float = 0.1
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, hidden_BxLxH, first_BxL, second_BxL, train):
    batch, _, h = hidden_BxLxH.shape
    # Initial state: softmax(w . x_l) summary of the (dropped-out) first segment; the
    # reference's nn.Linear(H, 1), kept as a vector and a bias to fold the mask in.
    w_H = self.param('query_kernel', head_init, (h,))
    b = self.param('query_bias', nn.initializers.zeros, ())
    m_BxH = sequence_dropout_mask(self.dropout, batch, h, train, self.dtype)
    scores_BxL = jnp.einsum('blh,bh->bl', hidden_BxLxH, m_BxH * w_H.astype(self.dtype))
    alpha_BxL = masked_softmax(scores_BxL + b.astype(self.dtype), first_BxL)
    s_BxH = m_BxH * jnp.einsum('bl,blh->bh', alpha_BxL.astype(self.dtype), hidden_BxLxH)

    # The turns share their weights: a scan compiles one turn, not `turns` copies.
    turns = nn.scan(
      SanTurn,
      variable_broadcast='params',
      split_rngs={'params': False, 'dropout': True},
      in_axes=(nn.broadcast, nn.broadcast),
      length=self.turns,
    )
    _, logits_TxBxC = turns(self.classes, self.dropout, train, self.dtype, name='turn')(
      s_BxH, hidden_BxLxH, second_BxL
    )

    probs_BxTxC = jax.nn.softmax(logits_TxBxC.transpose(1, 0, 2), axis=-1)
    if train and self.mem_drop > 0:
      # Stochastic prediction dropout: drop whole turns, but always keep one random turn.
      keep_rng, turn_rng = jax.random.split(self.make_rng('dropout'))
      keep_BxT = jax.random.bernoulli(keep_rng, 1 - self.mem_drop, (batch, self.turns))
      forced = jax.random.randint(turn_rng, (batch,), 0, self.turns)
      keep_BxT = keep_BxT | jax.nn.one_hot(forced, self.turns, dtype=jnp.bool_)
      probs_BxTxC = probs_BxTxC * (keep_BxT / (1 - self.mem_drop))[..., None]
    return jnp.log(probs_BxTxC.mean(axis=1))
