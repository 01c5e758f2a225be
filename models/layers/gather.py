"""Row gather whose gradient scatter-adds in float32 whatever the table's dtype.

The gradient of `table[index]` is a scatter-add of the output's cotangent into a zero table of
the table's dtype. For a 16-bit table a GPU has no native atomic add on that path: each update
is a compare-and-swap loop, and rows that many indices share serialize (the cost that made
BERT's bf16 embedding gradient slow, see `embed`). `take_rows` gathers exactly as indexing does
and adds the gradient in float32, then casts it to the table's dtype once: the forward program
and the values are indexing's, the backward's sum loses no 16-bit precision on shared rows.
"""

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _take(table, index, rows):
  del rows
  return table[index]


def _take_fwd(table, index, rows):
  return table[index], index


def _take_bwd(rows, index, cotangent):
  tail = cotangent.shape[index.ndim :]
  grad = jnp.zeros((rows, *tail), jnp.float32).at[index].add(cotangent.astype(jnp.float32))
  return grad.astype(cotangent.dtype), None


_take.defvjp(_take_fwd, _take_bwd)


def take_rows(table: jax.Array, index: jax.Array) -> jax.Array:
  """`table[index]` (rows along axis 0), its gradient summed in float32."""
  if table.dtype == jnp.float32:
    return table[index]  # already float32: indexing's own program
  return _take(table, index, table.shape[0])
