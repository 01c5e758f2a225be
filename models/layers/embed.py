"""Embedding lookup whose gradient accumulates in float32, not in a 16-bit compute dtype.

Flax's `nn.Embed` casts the whole table to the compute dtype and gathers from the cast copy,
so under bf16 or fp16 the gradient is a scatter-add of every token's row into a 16-bit table.
A GPU has no native 16-bit atomic add on that path: each update is a compare-and-swap loop, and
rows that many tokens share serialize. On an H200, BERT-base's token-type table (2 rows, all
8,192 tokens of a 64-sequence batch) took 46 ms of a 65 ms bf16 step that way.

Under a 16-bit compute dtype `Embed` gathers from the float32 table and casts the gathered rows,
so the scatter-add runs in float32; and it reads a table of at most `ONE_HOT_MAX` rows as one-hot
times the table, a matrix product whose gradient is another (the form Google's BERT uses for its
token types). Under float32 its lookup is nn.Embed's. The values are nn.Embed's in every dtype;
`attend` (the tied output projection) is nn.Embed's.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

ONE_HOT_MAX = 16  # 16-bit compute: tables this small (token types, languages) by matrix product


class Embed(nn.Embed):
  """nn.Embed whose 16-bit lookup reads the float32 table (small tables by one-hot)."""

  def __call__(self, inputs: jax.Array) -> jax.Array:
    dtype = self.dtype or self.embedding.dtype
    if jnp.dtype(dtype).itemsize > 2 or not jnp.issubdtype(inputs.dtype, jnp.integer):
      return super().__call__(inputs)  # float32 (and nn.Embed's own input check)
    if self.num_embeddings <= ONE_HOT_MAX:
      one_hot = jax.nn.one_hot(inputs, self.num_embeddings, dtype=dtype)
      # Exact: one nonzero term per output, so the product is the cast row.
      return jnp.dot(one_hot, self.embedding.astype(dtype), precision=jax.lax.Precision.HIGHEST)
    return jnp.take(self.embedding, inputs, axis=0).astype(dtype)
