"""Embedding lookup whose gradient accumulates in the table's float32, not the compute dtype.

Flax's `nn.Embed` casts the whole table to the compute dtype and gathers from the cast copy,
so under bf16 or fp16 the gradient is a scatter-add of every token's row into a 16-bit table.
A GPU has no native 16-bit atomic add on that path: each update is a compare-and-swap loop, and
rows that many tokens share serialize. On an H200, BERT-base's token-type table (2 rows, all
8,192 tokens of a 64-sequence batch) took 46 ms of a 65 ms bf16 step that way.

`Embed` gathers from the float32 table and casts the gathered rows, so the scatter-add runs in
float32; and a table of at most `ONE_HOT_MAX` rows is read as one-hot times table, a matrix
product whose gradient is another (the form Google's BERT uses for its token types). Both give
the same values as `nn.Embed` to the compute dtype's rounding; `attend` (the tied output
projection) is nn.Embed's.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

ONE_HOT_MAX = 16  # tables this small (token types, languages) are read as a matrix product


class Embed(nn.Embed):
  """nn.Embed with its lookup in float32 (small tables by one-hot), cast to `dtype` after."""

  def __call__(self, inputs: jax.Array) -> jax.Array:
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError('Input type must be an integer or unsigned integer.')
    dtype = self.dtype or self.embedding.dtype
    if self.num_embeddings <= ONE_HOT_MAX:
      one_hot = jax.nn.one_hot(inputs, self.num_embeddings, dtype=dtype)
      return jnp.dot(one_hot, self.embedding.astype(dtype), precision=jax.lax.Precision.HIGHEST)
    return jnp.take(self.embedding, inputs, axis=0).astype(dtype)
