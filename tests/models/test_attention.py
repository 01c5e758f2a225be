"""Attention dropout: one draw per sequence, head and probability, as BERT and fairseq."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

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


def _layers_loss(probs, length=LENGTH, layers=2):
  """A loss over attention layers in training (dropout on), as a function of (params, x); probs
  is one of attention.PROBS or an attention function of Flax's signature."""
  width = HEADS * HEAD_DIM
  if callable(probs):
    module = nn.MultiHeadDotProductAttention(
      num_heads=HEADS, dropout_rate=0.3, broadcast_dropout=False, deterministic=False,
      attention_fn=probs,
    )  # fmt: skip
  else:
    module = attention.multi_head(HEADS, 0.3, True, probs=probs)
  x = jax.random.normal(jax.random.key(0), (BATCH, length, width))
  params = module.init({'params': jax.random.key(1)}, x, x)['params']
  mask = jnp.tril(jnp.ones((BATCH, 1, length, length), bool))

  def loss(params, x):
    for i in range(layers):
      rngs = {'dropout': jax.random.key(2 + i)}
      x = module.apply({'params': params}, x, x, mask=mask, rngs=rngs)
    return jnp.sum(jnp.sin(x))

  return loss, params, x


def test_recomputed_probabilities_give_the_saved_ones_values_and_gradients():
  saved, params, x = _layers_loss('saved')
  recomputed, _, _ = _layers_loss('recomputed')
  want = jax.value_and_grad(saved, argnums=(0, 1))(params, x)
  got = jax.value_and_grad(recomputed, argnums=(0, 1))(params, x)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_recomputed_probabilities_are_not_kept_for_the_backward_pass():
  """What the backward pass reads from the forward (jax.vjp's residuals): each layer's L x L
  arrays in the saved form (the scores, the probabilities, the dropped ones, the mask), none in
  the recomputed form."""
  layers, length = 3, 8  # no other array ends in [8, 8]

  def per_head_arrays(probs):
    loss, params, x = _layers_loss(probs, length, layers)
    _, backward = jax.vjp(loss, params, x)  # a pytree whose leaves are the residuals
    return [a for a in jax.tree.leaves(backward) if a.shape == (BATCH, HEADS, length, length)]

  assert len(per_head_arrays('saved')) >= 3 * layers
  assert per_head_arrays('recomputed') == []


def test_attention_probs_is_a_config_key_of_the_attention_workloads():
  from models import registry  # pylint: disable=g-import-not-at-top

  defaults = {
    'bert_base': 'auto',
    'bert_squad': 'auto',
    'mt_dnn': 'auto',
    'transformer_big': 'auto',
  }
  for name, default in defaults.items():
    w = registry.get(name)
    assert w.resolve(tiny=True)['attention_probs'] == default
    for choice in ('saved', 'recomputed', 'fused', 'auto'):
      assert (
        w.resolve(tiny=True, overrides={'attention_probs': choice})['attention_probs'] == choice
      )
    try:
      w.resolve(tiny=True, overrides={'attention_probs': 'flash'})
    except ValueError as e:
      assert 'must be one of saved, recomputed, fused, auto' in str(e)
    else:
      raise AssertionError(f'{name} took attention_probs=flash')


def _flax_and_ours(dtype, probs='saved'):
  """Flax's MultiHeadDotProductAttention and multi_head's MultiHead, alike in every setting."""
  ours = attention.multi_head(HEADS, 0.3, True, dtype=dtype, probs=probs)
  flax_module = nn.MultiHeadDotProductAttention(
    num_heads=HEADS, dropout_rate=0.3, broadcast_dropout=False, deterministic=False,
    dtype=dtype, attention_fn=attention.attention_fn(probs, dtype),
  )  # fmt: skip
  return flax_module, ours


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('cross', [False, True])
def test_multi_head_is_flax_attention_with_its_parameters_values_and_gradients(dtype, cross):
  """The same parameter tree and initial values from the same key, and the same outputs and
  gradients (of the parameters and of both inputs) with dropout on, for self-attention (one
  product for query, key and value) and cross-attention (query apart, key and value together)."""
  flax_module, ours = _flax_and_ours(dtype)
  width = HEADS * HEAD_DIM
  x = jax.random.normal(jax.random.key(0), (BATCH, LENGTH, width))
  memory = jax.random.normal(jax.random.key(3), (BATCH, LENGTH + 2, width)) if cross else x
  mask = jnp.tril(jnp.ones((BATCH, 1, LENGTH, memory.shape[1]), bool))
  want_params = flax_module.init({'params': jax.random.key(1)}, x, memory)['params']
  got_params = ours.init({'params': jax.random.key(1)}, x, memory)['params']
  assert jax.tree.structure(got_params) == jax.tree.structure(want_params)
  for a, b in zip(jax.tree.leaves(want_params), jax.tree.leaves(got_params)):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)

  def loss(module, params, x, memory):
    kv = x if not cross else memory  # the same array for self-attention, as the models pass it
    out = module.apply({'params': params}, x, kv, mask=mask, rngs={'dropout': jax.random.key(2)})
    return jnp.sum(jnp.sin(out.astype(jnp.float32)))

  def value_and_grads(module):
    return jax.value_and_grad(lambda *a: loss(module, *a), argnums=(0, 1, 2))(
      want_params, x, memory
    )

  want, got = value_and_grads(flax_module), value_and_grads(ours)
  tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else dict(rtol=0.05, atol=0.05)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **tolerance)
