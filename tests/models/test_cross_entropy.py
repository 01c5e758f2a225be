"""models/layers/cross_entropy: the log-softmax form's values and gradients, in two passes."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.layers import cross_entropy

VOCAB = 37


def _log_softmax_form(logits, labels, epsilon):
  """What the workloads computed before: log-softmax in float32, the label's entry taken."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
  loss = (1.0 - epsilon) * nll + (epsilon / logp.shape[-1]) * -logp.sum(axis=-1)
  return loss, nll


def _inputs(dtype=jnp.float32, shape=(3, 5)):
  keys = jax.random.split(jax.random.key(0), 4)
  logits = (4.0 * jax.random.normal(keys[0], (*shape, VOCAB))).astype(dtype)
  labels = jax.random.randint(keys[1], shape, 0, VOCAB)
  # Cotangents for both outputs, as a loss and a metric that is also differentiated would give.
  g_loss, g_nll = jax.random.normal(keys[2], shape), jax.random.normal(keys[3], shape)
  return logits, labels, g_loss, g_nll


def _objective(form, epsilon, labels, g_loss, g_nll):
  def f(logits):
    loss, nll = form(logits, labels, epsilon)
    return (loss * g_loss).sum() + (nll * g_nll).sum()

  return f


@pytest.mark.parametrize('epsilon', [0.0, 0.1])
def test_values_and_gradients_are_the_log_softmax_forms(epsilon):
  logits, labels, g_loss, g_nll = _inputs()
  with jax.default_matmul_precision('float32'):
    want = _log_softmax_form(logits, labels, epsilon)
    got = cross_entropy.token_losses(logits, labels, epsilon)
    want_grad = jax.grad(_objective(_log_softmax_form, epsilon, labels, g_loss, g_nll))(logits)
    got_grad = jax.grad(_objective(cross_entropy.token_losses, epsilon, labels, g_loss, g_nll))(
      logits
    )
  for w, g in zip(want, got):
    assert g.shape == labels.shape and g.dtype == jnp.float32
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5, atol=1e-6)


def test_16_bit_logits_give_float32_losses_and_a_gradient_of_their_own_dtype():
  logits, labels, g_loss, g_nll = _inputs(jnp.bfloat16)
  loss, nll = cross_entropy.token_losses(logits, labels, 0.1)
  want_loss, want_nll = _log_softmax_form(logits, labels, 0.1)
  assert loss.dtype == nll.dtype == jnp.float32
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(nll, want_nll, rtol=1e-6, atol=1e-6)
  grad = jax.grad(_objective(cross_entropy.token_losses, 0.1, labels, g_loss, g_nll))(logits)
  want = jax.grad(_objective(_log_softmax_form, 0.1, labels, g_loss, g_nll))(logits)
  assert grad.dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(grad, np.float32), np.asarray(want, np.float32), rtol=1e-2, atol=1e-2
  )


def test_the_gradient_writes_no_scatter_and_keeps_less_memory():
  """The log-softmax form's gradient scatter-adds into an [N, V] array of zeros and keeps the
  float32 log-probabilities; this one is an elementwise pass over the logits."""
  logits = jnp.zeros((256, 4096), jnp.bfloat16)
  labels = jnp.zeros((256,), jnp.int32)

  def compiled(form):
    f = lambda x, labels: form(x, labels, 0.1)[0].sum()
    return jax.jit(jax.grad(f)).lower(logits, labels).compile()

  ours, theirs = compiled(cross_entropy.token_losses), compiled(_log_softmax_form)
  scatters = lambda c: re.findall(r'= \S+ scatter\(', c.as_text())  # HLO scatter instructions
  assert scatters(theirs)  # what the check would see if the form came back
  assert not scatters(ours)
  temp = lambda c: c.memory_analysis().temp_size_in_bytes
  assert temp(ours) < temp(theirs)
