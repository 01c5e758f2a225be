"""MT-DNN's Adamax (Kingma & Ba 2015, as module/bert_optim.py) as an optax transform."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class AdamaxState(NamedTuple):
  mu: Any
  nu: Any


def scale_by_mtdnn_adamax(b1=0.9, b2=0.999, eps=1e-6):
  """MT-DNN's Adamax (module/bert_optim.py): no bias correction, u = max(b2 u, |g| + eps)."""

  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return AdamaxState(mu=zeros(), nu=zeros())

  def update(grads, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
    nu = jax.tree.map(lambda u, g: jnp.maximum(b2 * u, jnp.abs(g) + eps), state.nu, grads)
    return jax.tree.map(lambda m, u: m / (u + eps), mu, nu), AdamaxState(mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)
