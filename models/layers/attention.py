"""Multi-head attention with dropout on the attention probabilities as BERT and fairseq draw it."""

import inspect
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from models.layers import fused_attention

# What the backward pass gets of each layer's L x L arrays (the scores, the probabilities, the
# dropout mask): 'saved' keeps them from the forward pass, as the 2020 programs (TensorFlow's
# BERT, fairseq) did; 'recomputed' keeps only the queries, keys and values and computes the
# arrays again in the backward pass (XLA's kernels under jax.checkpoint); 'fused' computes the
# attention in fused kernels that keep only the dropout mask, a byte a probability, and
# recompute the rest in their backward pass, as PyTorch's scaled_dot_product_attention does
# (fused_attention.py); 'auto' is 'fused' in a program compiled for a GPU under a 16-bit compute
# dtype, and under float32 with TF32 products where the keys are at least TF32_FUSED_MIN_KEYS
# long, where it is the faster (docs/performance.md); 'saved' under TF32 for shorter keys, under
# full float32 products, where the kernels' own are 3x slower, and on a CPU, where the fused
# kernels run in Pallas' interpreter.
# 'saved' and 'recomputed' give the same values from the same random bits (jax.random.bernoulli's);
# the fused kernels draw four decisions a hash by default, kept at the nearest multiple of 2**-16
# to the rate's complement (fused_attention.DECISIONS_PER_HASH; decisions_per_hash=1 gives
# jax.random.bernoulli's).
PROBS = ('saved', 'recomputed', 'fused', 'auto')

# How the query, key and value are projected: 'joined', one product for a self-attention's three
# and one for a cross-attention's key and value, each with its bias in the product (MultiHead);
# 'flax', Flax's MultiHeadDotProductAttention, three DenseGenerals whose [heads, depth] bias XLA
# adds apart. The same parameters, random draws and values either way.
PROJECTIONS = ('joined', 'flax')

# Under TF32 the fused kernels keep a layer's L x L arrays out of memory at the cost of products
# smaller than cuBLAS's: in the whole step they ran 1.04x the saved attention at BERT's 128 and 384
# positions, and 0.98x at transformer_big's 30-token sentences (docs/performance.md, "Fused
# attention in tf32, the whole step"). 'auto' takes them from this many keys.
TF32_FUSED_MIN_KEYS = 128


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

  The parameters are named, not **kwargs: MultiHead, as Flax's MultiHeadDotProductAttention,
  passes only the keyword arguments that an attention_fn's signature names."""

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


def fused_on_gpu_attention(
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
  """The fused kernels in a program compiled for a CUDA GPU (a deviceless compile for one
  included), nn.dot_product_attention in one compiled for anything else. The choice is made when
  the program is lowered for its platform: the compiled program holds one of the two, not a
  conditional."""
  kwargs = dict(
    bias=bias,
    mask=mask,
    broadcast_dropout=broadcast_dropout,
    dropout_rng=dropout_rng,
    dropout_rate=dropout_rate,
    deterministic=deterministic,
    dtype=dtype,
    precision=precision,
    force_fp32_for_softmax=force_fp32_for_softmax,
  )
  return lax.platform_dependent(
    query,
    key,
    value,
    cuda=lambda q, k, v: fused_attention.dot_product_attention(q, k, v, **kwargs),
    default=lambda q, k, v: nn.dot_product_attention(q, k, v, **kwargs),
  )


def fused_on_a_gpu_for_long_keys_attention(query, key, value, **kwargs):
  """'auto' under TF32: fused_on_gpu_attention for keys ([..., L, heads, depth]) of at least
  TF32_FUSED_MIN_KEYS, nn.dot_product_attention for shorter ones; the shapes are static, so the
  choice is made as the program is traced."""
  long_keys = key.shape[-3] >= TF32_FUSED_MIN_KEYS
  attend = fused_on_gpu_attention if long_keys else nn.dot_product_attention
  return attend(query, key, value, **kwargs)


# MultiHead, as Flax's MultiHeadDotProductAttention, passes an attention_fn only the keyword
# arguments its signature names: this one takes those of the function it may call.
fused_on_a_gpu_for_long_keys_attention.__signature__ = inspect.signature(fused_on_gpu_attention)


def _unpacked(qkv):
  """The query, key and value of a packed [..., L, 3, H, D] array."""
  return qkv[..., 0, :, :], qkv[..., 1, :, :], qkv[..., 2, :, :]


def fused_on_gpu_packed_attention(qkv, **kwargs):
  """fused_on_gpu_attention of a self-attention's packed query, key and value ([B, L, 3, H, D]):
  the fused kernels read them from the one array on a CUDA GPU (fused_attention.
  packed_dot_product_attention); elsewhere nn.dot_product_attention takes them apart."""
  return lax.platform_dependent(
    qkv,
    cuda=lambda qkv: fused_attention.packed_dot_product_attention(qkv, **kwargs),
    default=lambda qkv: nn.dot_product_attention(*_unpacked(qkv), **kwargs),
  )


def fused_on_a_gpu_for_long_keys_packed_attention(qkv, **kwargs):
  """fused_on_a_gpu_for_long_keys_attention of a packed [B, L, 3, H, D] self-attention."""
  if qkv.shape[-4] >= TF32_FUSED_MIN_KEYS:
    return fused_on_gpu_packed_attention(qkv, **kwargs)
  return nn.dot_product_attention(*_unpacked(qkv), **kwargs)


# The attention functions that read a self-attention's query, key and value packed in one array,
# as one product computes them (MultiHead): the same values and gradients without the three
# arrays sliced out of the product's result. The others take them apart.
_PACKED = {
  fused_attention.dot_product_attention: fused_attention.packed_dot_product_attention,
  fused_on_gpu_attention: fused_on_gpu_packed_attention,
  fused_on_a_gpu_for_long_keys_attention: fused_on_a_gpu_for_long_keys_packed_attention,
}


_ATTENTION_FN = {
  'saved': nn.dot_product_attention,
  'recomputed': recomputed_attention,
  'fused': fused_attention.dot_product_attention,
  'fused on a GPU': fused_on_gpu_attention,
  'fused on a GPU for long keys': fused_on_a_gpu_for_long_keys_attention,
}


def attention_fn(probs: str, dtype: Any = jnp.float32):
  """The attention function of one of PROBS, with Flax's dot_product_attention signature; 'auto'
  is resolved for the compute dtype and the matrix-product precision in force (the policy's,
  set while a step is traced)."""
  if probs not in PROBS:
    raise ValueError(f'attention probs must be one of {", ".join(PROBS)}, got {probs!r}')
  if probs == 'auto':
    if jnp.dtype(dtype).itemsize == 2:
      probs = 'fused on a GPU'
    elif fused_attention.tf32_products():
      probs = 'fused on a GPU for long keys'
    else:
      probs = 'saved'
  return _ATTENTION_FN[probs]


class _Projection(nn.Module):
  """The kernel [features, heads, depth] and bias [heads, depth] of one of the query, key and
  value projections, declared as Flax's DenseGeneral declares them (the same names, shapes,
  initializers and random draws), for MultiHead to multiply."""

  features: int
  heads: int
  depth: int

  @nn.compact
  def __call__(self):
    flat = (self.features, self.heads * self.depth)
    kernel = self.param(
      'kernel',
      lambda rng: nn.initializers.lecun_normal()(rng, flat, jnp.float32).reshape(
        self.features, self.heads, self.depth
      ),
    )
    bias = self.param('bias', lambda rng: jnp.zeros((self.heads, self.depth), jnp.float32))
    return kernel, bias


class MultiHead(nn.Module):
  """Flax's MultiHeadDotProductAttention, with its parameters, its random draws and its values,
  computing the projections as one product.

  Flax projects the query, the key and the value with three DenseGenerals, whose [heads, depth]
  bias XLA's GPU compiler does not fuse into the product: it writes the bias broadcast to the
  whole projection and passes it to cuBLAS to add (beta = 1), a write and a read of an activation
  a projection. Here the kernels are joined into one [features, n * heads * depth] matrix and the
  biases into one vector: a self-attention's query, key and value come from one product with its
  bias in the product's epilogue, a cross-attention's key and value from another. The fused
  attention kernels read a self-attention's three from that product's result as it is (_PACKED).
  """

  num_heads: int
  dropout_rate: float = 0.0
  broadcast_dropout: bool = True
  deterministic: bool | None = None
  dtype: Any = jnp.float32
  attention_fn: Any = nn.dot_product_attention

  def _project(self, inputs, names):
    """inputs [..., features] projected by the named projections: [..., n, heads, depth]."""
    features = inputs.shape[-1]
    heads, depth = self.num_heads, features // self.num_heads
    params = [_Projection(features, heads, depth, name=name)() for name in names]
    kernel = jnp.concatenate([k.reshape(features, heads * depth) for k, _ in params], axis=1)
    bias = jnp.concatenate([b.reshape(heads * depth) for _, b in params])
    y = lax.dot_general(
      inputs.astype(self.dtype),
      kernel.astype(self.dtype),
      (((inputs.ndim - 1,), (0,)), ((), ())),
    )
    return (y + bias.astype(self.dtype)).reshape(*inputs.shape[:-1], len(names), heads, depth)

  @nn.compact
  def __call__(self, inputs_q, inputs_kv=None, *, mask=None, deterministic=None):
    """Attention of inputs_q [..., L, features] over inputs_kv [..., S, features] (inputs_q
    itself when None), as MultiHeadDotProductAttention(inputs_q, inputs_kv, mask=mask)."""
    features = inputs_q.shape[-1]
    if features % self.num_heads:
      raise ValueError(f'{features} features do not split into {self.num_heads} heads')
    self_attention = inputs_kv is None or inputs_kv is inputs_q
    if self_attention:
      qkv = self._project(inputs_q, ('query', 'key', 'value'))
    else:
      qkv = None
      query = self._project(inputs_q, ('query',))[..., 0, :, :]
      kv = self._project(inputs_kv, ('key', 'value'))
      key, value = kv[..., 0, :, :], kv[..., 1, :, :]
    dropout_rng = None
    if self.dropout_rate > 0.0:
      deterministic = nn.merge_param('deterministic', self.deterministic, deterministic)
      if not deterministic:
        dropout_rng = self.make_rng('dropout')
    else:
      deterministic = True
    kwargs = dict(
      mask=mask,
      dropout_rng=dropout_rng,
      dropout_rate=self.dropout_rate,
      broadcast_dropout=self.broadcast_dropout,
      deterministic=deterministic,
      dtype=self.dtype,
    )
    named = inspect.signature(self.attention_fn).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in named}
    if self_attention and self.attention_fn in _PACKED:
      x = _PACKED[self.attention_fn](qkv, **kwargs)
    elif self_attention:
      x = self.attention_fn(*_unpacked(qkv), **kwargs)
    else:
      x = self.attention_fn(query, key, value, **kwargs)
    return nn.DenseGeneral(features, axis=(-2, -1), dtype=self.dtype, name='out')(x)


def multi_head(
  heads: int,
  dropout: float,
  train: bool,
  dtype: Any = jnp.float32,
  name=None,
  probs: str = 'saved',
  projections: str = 'joined',
):
  """Multi-head dot-product attention with one dropout draw per probability.

  BERT (`dropout(attention_probs)` on [B, N, F, T]) and fairseq (`F.dropout` on
  [B*N, T, S]) drop each sequence's and each head's probabilities independently. Flax's
  default (`broadcast_dropout=True`) draws one L x L mask shared by the whole batch and every
  head: a different regulariser, and a mask B*N times smaller in memory. `probs` is one of
  PROBS, `projections` one of PROJECTIONS.
  """
  if projections not in PROJECTIONS:
    raise ValueError(f'projections must be one of {", ".join(PROJECTIONS)}, got {projections!r}')
  module = MultiHead if projections == 'joined' else nn.MultiHeadDotProductAttention
  return module(
    num_heads=heads,
    dropout_rate=dropout,
    broadcast_dropout=False,
    deterministic=not train,
    dtype=dtype,
    attention_fn=attention_fn(probs, dtype),
    name=name,
  )
