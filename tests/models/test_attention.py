"""Attention dropout: one draw per sequence, head and probability, as BERT and fairseq."""

import jax
import jax.numpy as jnp
import numpy as np

from models.layers import attention

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 6, 2, 3


def _twin_heads_output(train):
  """Attention over two identical sequences with two identical heads, each head's output kept
  apart: without dropout every sequence and head computes the same thing."""
  width = HEADS * HEAD_DIM
  module = attention.multi_head(HEADS, 0.5, train)
  x = jnp.broadcast_to(
    jax.random.normal(jax.random.key(0), (1, LENGTH, width)), (BATCH, LENGTH, width)
  )
  params = module.init({'params': jax.random.key(1)}, x, x)['params']
  for name in ('query', 'key', 'value'):
    kernel, bias = params[name]['kernel'], params[name]['bias']  # (D, H, Dh), (H, Dh)
    params[name] = {
      'kernel': jnp.broadcast_to(kernel[:, :1], kernel.shape),
      'bias': jnp.broadcast_to(bias[:1] + 0.1, bias.shape),
    }
  # Head h's output lands in features h*Dh .. (h+1)*Dh - 1, untouched.
  params['out'] = {
    'kernel': jnp.eye(width).reshape(HEADS, HEAD_DIM, width),
    'bias': jnp.zeros((width,)),
  }
  out = module.apply({'params': params}, x, x, rngs={'dropout': jax.random.key(2)})
  return np.asarray(out).reshape(BATCH, LENGTH, HEADS, HEAD_DIM)


def test_without_dropout_the_twin_sequences_and_heads_agree():
  out = _twin_heads_output(train=False)
  np.testing.assert_allclose(out[0], out[1], rtol=1e-6)
  np.testing.assert_allclose(out[:, :, 0], out[:, :, 1], rtol=1e-6)


def test_dropout_masks_differ_across_sequences_and_heads():
  out = _twin_heads_output(train=True)
  assert not np.allclose(out[0], out[1])  # another mask for each sequence
  assert not np.allclose(out[:, :, 0], out[:, :, 1])  # and for each head of a sequence
