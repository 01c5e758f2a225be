"""The fused attention kernels against Flax's dot_product_attention (Pallas' interpreter on a CPU).

With one dropout decision per hash the kernels promise Flax's values and gradients with
broadcast_dropout=False for the same key: the same decisions, drawn in the kernel. With four
(the default) they promise reference_attention's: Flax's weights dropped by
threefry_bits.keep_mask_grouped's decisions. The shapes are chosen to reach every path: a length
that is not a multiple of the tile (padded queries and keys) nor of the group, several key tiles
(the separate dQ kernel) and one (dQ in the dK/dV kernel), a mask per head and one for all
heads, a row with every key masked, keys longer than queries.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax.extend import random as jex_random

from models.layers import attention, fused_attention, fused_attention_kernels, threefry_bits

SMALL_TILES = dict(block_q=16, block_k=16, block_bwd=16)


def _inputs(seed, batch, lq, lk, heads, d, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (batch, lq, heads, d), dtype)
  k = jax.random.normal(keys[1], (batch, lk, heads, d), dtype)
  v = jax.random.normal(keys[2], (batch, lk, heads, d), dtype)
  cotangent = jax.random.normal(keys[3], (batch, lq, heads, d), jnp.float32)
  return q, k, v, cotangent


def _values_and_grads(fn, q, k, v, cotangent):
  out, vjp = jax.vjp(fn, q, k, v)
  return out, vjp(cotangent.astype(out.dtype))


def _rel_err(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return np.linalg.norm(got - want) / np.linalg.norm(want)


def test_the_kernel_hash_is_jax_threefry2x32():
  """The in-kernel hash against JAX's own threefry, on counters whose high word is set (a flat
  index past 2**32, as at full size)."""
  rng = np.random.default_rng(0)
  k0, k1 = (np.uint32(x) for x in rng.integers(0, 2**32, 2))
  x0 = jnp.asarray(rng.integers(0, 2**32, 64), jnp.uint32)
  x1 = jnp.asarray(rng.integers(0, 2**32, 64), jnp.uint32)
  want = jex_random.threefry_2x32(jnp.array([k0, k1], jnp.uint32), jnp.concatenate([x0, x1]))
  got = threefry_bits.threefry2x32(k0, k1, x0, x1)
  np.testing.assert_array_equal(np.concatenate(got), want)


def test_keep_mask_is_jax_random_bernoulli_on_the_flat_index():
  key = jax.random.key(3)
  shape = (2, 3, 5, 7)
  want = jax.random.bernoulli(key, 0.9, shape).reshape(-1)
  k0, k1 = jax.random.key_data(key).astype(jnp.uint32)
  lo = jnp.arange(want.size, dtype=jnp.uint32)
  got = threefry_bits.keep_mask(k0, k1, jnp.zeros_like(lo), lo, 0.9)
  np.testing.assert_array_equal(got, want)
  assert 0 < int(want.sum()) < want.size


def test_keep_mask_array_with_a_hash_per_decision_is_jax_random_bernoulli():
  key = jax.random.key(4)
  shape = (2, 3, 5, 7)
  want = jax.random.bernoulli(key, 0.8, shape)
  np.testing.assert_array_equal(threefry_bits.keep_mask_array(key, shape, 0.8, 1), want)


def test_keep_mask_array_refuses_counters_past_the_low_word():
  with pytest.raises(ValueError, match='more than a 32-bit flat index holds'):
    threefry_bits.keep_mask_array(jax.random.key(0), (2**16, 2**18), 0.5, 4)  # allocates nothing


def test_grouped_decisions_are_the_hash_quarters_in_order():
  """Counter g's four decisions, at 4g to 4g + 3: x0's low and high 16 bits, then x1's."""
  rng = np.random.default_rng(1)
  k0, k1 = (np.uint32(x) for x in rng.integers(0, 2**32, 2))
  lo = jnp.asarray(rng.integers(0, 2**32, (3, 5)), jnp.uint32)
  hi = jnp.asarray(rng.integers(0, 2**32, (3, 5)), jnp.uint32)
  keep = threefry_bits.grouped_keep(0.7)
  got = np.asarray(threefry_bits.keep_mask_grouped(k0, k1, hi, lo, keep))
  x0, x1 = (np.asarray(x) for x in threefry_bits.threefry2x32(k0, k1, hi, lo))
  quarters = np.stack([x0 & 0xFFFF, x0 >> 16, x1 & 0xFFFF, x1 >> 16], axis=-1).reshape(3, 20)
  np.testing.assert_array_equal(got, quarters < round(0.7 * 2**16))
  assert 0 < got.sum() < got.size


def test_grouped_keep_is_the_nearest_multiple_of_a_sixteen_bit_step():
  assert threefry_bits.grouped_keep(0.9) == 58_982 / 65_536
  assert threefry_bits.grouped_keep(1.0) == 1.0
  assert np.float32(threefry_bits.grouped_keep(0.9)) == threefry_bits.grouped_keep(0.9)
  with pytest.raises(ValueError, match='multiple of 2\\*\\*-16'):
    threefry_bits.keep_mask_grouped(np.uint32(0), np.uint32(1), jnp.zeros(4, jnp.uint32),
                                    jnp.zeros(4, jnp.uint32), 0.9)  # fmt: skip


def test_grouped_decisions_keep_at_their_rate_independently():
  """2**20 decisions: the share kept, and kept pairs at each offset within a group and across
  groups, are the rate's and the rate squared's within five standard deviations."""
  keep = threefry_bits.grouped_keep(0.9)
  kept = np.asarray(threefry_bits.keep_mask_array(jax.random.key(6), (256, 4096), keep, 4))
  n = kept.size
  assert abs(kept.mean() - keep) < 5 * np.sqrt(keep * (1 - keep) / n)
  for offset in (1, 2, 3, 4, 5):
    both = (kept[:, :-offset] & kept[:, offset:]).mean()
    assert abs(both - keep**2) < 5 * np.sqrt(keep**2 * (1 - keep**2) / (n - 256 * offset))


def test_the_flat_index_carries_into_its_high_word():
  spec = fused_attention_kernels.Spec(
    heads=1, q_len=4, k_len=4, keep=0.9, scale=1.0, tf32=False,
    block_q=16, block_k=16, block_bwd=16, warps=4, warps_bwd=4, stages=2,
  )  # fmt: skip
  base_lo = jnp.uint32(2**32 - 3)
  rows, cols = jnp.arange(2), jnp.arange(4)
  hi, lo = fused_attention_kernels.counters(spec, jnp.uint32(5), base_lo, rows, cols)
  flat = (np.asarray(hi, np.uint64) << np.uint64(32)) + np.asarray(lo, np.uint64)
  start = (5 << 32) + 2**32 - 3
  np.testing.assert_array_equal(flat, start + np.arange(8).reshape(2, 4))


@pytest.mark.parametrize(
  'lq, lk, heads_in_mask, blocks, per_hash',
  [
    (40, 40, 1, SMALL_TILES, 4),  # padded to 48, three key tiles: dQ in its own kernel
    (40, 40, 1, SMALL_TILES, 1),  # the same with jax.random.bernoulli's decisions
    (24, 24, 2, None, 4),  # one key tile: dQ in the dK/dV kernel; a mask per head
    (72, 72, 1, None, 4),  # full float32's default 32 x 32 tiles: padded to 96, three key tiles
    (8, 38, 1, SMALL_TILES, 4),  # keys longer than queries (cross attention), not a multiple of 4
  ],
)
def test_values_and_gradients_are_the_reference_with_a_dropout_mask_per_head(
  lq, lk, heads_in_mask, blocks, per_hash
):
  """One decision per hash: Flax's own attention; four: reference_attention's."""
  batch, heads, d = 2, 2, 8  # d is padded to 16 in the kernels
  q, k, v, cotangent = _inputs(lq + lk, batch, lq, lk, heads, d)
  mask = jax.random.bernoulli(jax.random.key(11), 0.8, (batch, heads_in_mask, lq, lk))
  mask = mask.at[0, 0, 1].set(False)  # a row with every key masked: uniform, as in Flax
  rng = jax.random.key(5)
  common = dict(mask=mask, dropout_rng=rng, dropout_rate=0.2)
  if per_hash == 1:
    want_fn = lambda q, k, v: nn.dot_product_attention(q, k, v, **common, broadcast_dropout=False)
  else:
    want_fn = lambda q, k, v: fused_attention.reference_attention(
      q, k, v, **common, decisions_per_hash=4
    )
  fused_fn = lambda q, k, v: fused_attention.dot_product_attention(
    q, k, v, **common, broadcast_dropout=False, blocks=blocks, decisions_per_hash=per_hash
  )
  with jax.default_matmul_precision('float32'):
    want = _values_and_grads(want_fn, q, k, v, cotangent)
    got = _values_and_grads(fused_fn, q, k, v, cotangent)
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    assert g.shape == w.shape and g.dtype == w.dtype
    assert _rel_err(g, w) < 1e-5


@pytest.mark.parametrize(
  'length, blocks, dtype',
  [
    (40, SMALL_TILES, jnp.float32),  # padded to 48, three key tiles: dQ in its own kernel
    (24, None, jnp.float32),  # one key tile: dQ in the dK/dV kernel
    (30, None, jnp.bfloat16),  # transformer_big's 30 positions, padded to 32
  ],
)
def test_a_packed_query_key_and_value_give_the_three_arrays_values_and_gradients(
  length, blocks, dtype
):
  """packed_dot_product_attention reads [B, L, 3, H, D] as the three arrays it holds: the same
  output, and the packed array's gradient is their three gradients in place."""
  batch, heads, d = 2, 2, 8
  keys = jax.random.split(jax.random.key(length), 2)
  qkv = jax.random.normal(keys[0], (batch, length, 3, heads, d), dtype)
  cotangent = jax.random.normal(keys[1], (batch, length, heads, d), dtype)
  mask = jax.random.bernoulli(jax.random.key(11), 0.8, (batch, 1, length, length))
  common = dict(mask=mask, dropout_rng=jax.random.key(5), dropout_rate=0.2)
  common.update(broadcast_dropout=False, blocks=blocks)
  packed = lambda qkv: fused_attention.packed_dot_product_attention(qkv, **common)
  apart = lambda qkv: fused_attention.dot_product_attention(
    qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], **common
  )
  with jax.default_matmul_precision('float32'):
    want_out, want_vjp = jax.vjp(apart, qkv)
    got_out, got_vjp = jax.vjp(packed, qkv)
    (want_grad,), (got_grad,) = want_vjp(cotangent), got_vjp(cotangent)
  assert got_out.shape == want_out.shape and got_grad.shape == qkv.shape
  np.testing.assert_array_equal(got_out, want_out)
  np.testing.assert_array_equal(got_grad, want_grad)


def test_the_reference_with_a_hash_per_decision_is_flax():
  q, k, v, cotangent = _inputs(3, 2, 12, 12, 2, 8)
  common = dict(dropout_rng=jax.random.key(7), dropout_rate=0.1)
  with jax.default_matmul_precision('float32'):
    want = _values_and_grads(
      lambda q, k, v: nn.dot_product_attention(q, k, v, **common, broadcast_dropout=False),
      q, k, v, cotangent,
    )  # fmt: skip
    got = _values_and_grads(
      lambda q, k, v: fused_attention.reference_attention(q, k, v, **common, decisions_per_hash=1),
      q, k, v, cotangent,
    )  # fmt: skip
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_without_dropout_or_a_mask_the_kernels_are_plain_attention():
  q, k, v, cotangent = _inputs(1, 1, 20, 20, 2, 16)
  with jax.default_matmul_precision('float32'):
    want = _values_and_grads(nn.dot_product_attention, q, k, v, cotangent)
    got = _values_and_grads(
      lambda q, k, v: fused_attention.dot_product_attention(q, k, v, blocks=SMALL_TILES),
      q,
      k,
      v,
      cotangent,
    )
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    assert _rel_err(g, w) < 1e-5


@pytest.mark.parametrize('dtype, tolerance', [(jnp.bfloat16, 2e-2), (jnp.float16, 4e-3)])
def test_16_bit_inputs_stay_within_their_rounding_of_float32(dtype, tolerance):
  q, k, v, cotangent = _inputs(2, 2, 24, 24, 2, 16)
  rng = jax.random.key(9)
  common = dict(dropout_rng=rng, dropout_rate=0.1)
  with jax.default_matmul_precision('float32'):
    want = _values_and_grads(
      lambda q, k, v: fused_attention.reference_attention(q, k, v, **common), q, k, v, cotangent
    )
  low = [x.astype(dtype) for x in (q, k, v)]
  got = _values_and_grads(
    lambda q, k, v: fused_attention.dot_product_attention(
      q, k, v, **common, broadcast_dropout=False
    ),
    *low,
    cotangent,
  )
  for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    assert g.dtype == dtype
    assert _rel_err(g, w) < tolerance


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(bias=jnp.zeros((1, 1, 4, 4))), 'not an additive bias'),
    (dict(dropout_rate=0.1, dropout_rng=jax.random.key(0)), 'broadcast_dropout=False'),
    (
      dict(
        dropout_rate=0.1,
        broadcast_dropout=False,
        dropout_rng=jax.random.key(0, impl='rbg'),
      ),
      'threefry2x32',
    ),
    (dict(decisions_per_hash=2), 'decisions_per_hash must be 1 or 4'),
  ],
)
def test_what_the_kernels_cannot_compute_is_refused(kwargs, message):
  q = jnp.zeros((1, 4, 1, 8))
  with pytest.raises(ValueError, match=message):
    fused_attention.dot_product_attention(q, q, q, **kwargs)


@pytest.mark.parametrize(
  'dtype, products, form',
  [
    (jnp.bfloat16, 'default', 'fused on a GPU'),
    (jnp.float16, 'default', 'fused on a GPU'),
    (jnp.float32, 'tensorfloat32', 'fused on a GPU for long keys'),
    (jnp.float32, 'float32', 'saved'),
    (jnp.float32, 'highest', 'saved'),
  ],
)
def test_auto_is_fused_where_the_products_run_on_tensor_cores(dtype, products, form):
  """16-bit compute: the fused kernels; float32 with TF32 products (the tf32 policy): the fused
  kernels for long keys; full float32 products, where the kernels' own run on the CUDA cores:
  XLA's attention, saved."""
  with jax.default_matmul_precision(products):
    module = attention.multi_head(2, 0.1, True, dtype=dtype, probs='auto')
  assert module.attention_fn is attention._ATTENTION_FN[form]


def _bf16_layer_step(probs):
  """A bf16 attention layer's loss and gradients (dropout on), jitted for this machine's CPU,
  and the text of the compiled program."""
  module = attention.multi_head(2, 0.1, True, dtype=jnp.bfloat16, probs=probs)
  x = jax.random.normal(jax.random.key(0), (2, 8, 16))
  params = module.init({'params': jax.random.key(1)}, x, x)['params']

  def loss(params, x):
    y = module.apply({'params': params}, x, x, rngs={'dropout': jax.random.key(2)})
    return jnp.sum(jnp.sin(y.astype(jnp.float32)))

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  return step(params, x), step.lower(params, x).compile().as_text()


def test_auto_compiled_for_a_cpu_is_the_saved_attention_not_the_interpreted_kernels():
  """Off a GPU the fused kernels would run in Pallas' interpreter (its grid as loops, slowly):
  'auto' compiles there to XLA's attention, the same program and bits as 'saved'."""
  auto, auto_text = _bf16_layer_step('auto')
  saved, saved_text = _bf16_layer_step('saved')
  _, fused_text = _bf16_layer_step('fused')
  for a, b in zip(jax.tree.leaves(auto), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(a, b)
  assert auto_text.count('while') == saved_text.count('while') < fused_text.count('while')


def test_fused_layers_give_the_reference_layers_values_and_gradients():
  """Two layers with a causal mask and dropout: the reference attention through Flax's
  MultiHeadDotProductAttention, the fused kernels through MultiHead."""
  from tests.models.test_attention import _layers_loss  # pylint: disable=g-import-not-at-top

  reference, params, x = _layers_loss(fused_attention.reference_attention)
  fused, _, _ = _layers_loss('fused')
  with jax.default_matmul_precision('float32'):
    want = jax.value_and_grad(reference, argnums=(0, 1))(params, x)
    got = jax.value_and_grad(fused, argnums=(0, 1))(params, x)
  for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
