"""The shifted-sum depthwise convolution against XLA's grouped convolution."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.layers import depthwise as dw
from models.stylegan import layers as sl

# (height, kernel, stride, rate, padding): the shapes DeepLab (fixed padding, strided and
# atrous) and NASNet (SAME, 3/5/7, strided) use, on odd and even sizes.
CASES = [
  (9, 3, 1, 1, 'SAME'),
  (10, 3, 2, 1, 'SAME'),
  (11, 5, 2, 1, 'SAME'),
  (12, 7, 1, 1, 'SAME'),
  (13, 3, 1, 2, ((2, 2), (2, 2))),
  (13, 3, 2, 1, ((1, 1), (1, 1))),
  (9, 3, 1, 3, 'VALID'),
  (8, 3, 2, 2, ((1, 2), (2, 1))),
]


@pytest.mark.parametrize('hw,k,stride,rate,padding', CASES)
def test_shifts_match_the_grouped_convolution_and_its_gradients(hw, k, stride, rate, padding):
  x = jax.random.normal(jax.random.key(0), (2, hw, hw + 1, 5))
  kernel = jax.random.normal(jax.random.key(1), (k, k, 1, 5))

  def loss(x, kernel, impl):
    return jnp.sum(jnp.sin(dw.depthwise_conv(x, kernel, stride, padding, rate, impl)))

  y = dw.depthwise_conv(x, kernel, stride, padding, rate, 'shifts')
  y_cudnn = dw.depthwise_conv(x, kernel, stride, padding, rate, 'cudnn')
  assert y.shape == y_cudnn.shape
  np.testing.assert_allclose(y, y_cudnn, atol=1e-4)
  g = jax.grad(loss, argnums=(0, 1))(x, kernel, 'shifts')
  g_cudnn = jax.grad(loss, argnums=(0, 1))(x, kernel, 'cudnn')
  for a, b in zip(g, g_cudnn):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(a, b, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize('rate,form', [(1, 'cudnn'), (2, 'shifts')])
def test_auto_is_cudnn_except_for_dilated_kernels(rate, form):
  x = jax.random.normal(jax.random.key(0), (1, 9, 9, 4))
  kernel = jax.random.normal(jax.random.key(1), (3, 3, 1, 4))
  lowered = lambda impl: (
    jax.jit(lambda x, k: dw.depthwise_conv(x, k, rate=rate, impl=impl)).lower(x, kernel).as_text()
  )
  assert lowered('auto') == lowered(form)
  assert lowered('auto') != lowered('shifts' if form == 'cudnn' else 'cudnn')


@pytest.mark.parametrize('impl', dw.IMPLS)
def test_bf16_accumulates_in_float32_and_returns_bf16(impl):
  # 49 taps of 1 + 2^-7 on ones: a bf16 running sum would round the increments away.
  x = jnp.ones((1, 7, 7, 2), jnp.bfloat16)
  kernel = jnp.full((7, 7, 1, 2), 1.0 + 2.0**-7, jnp.bfloat16)
  y = dw.depthwise_conv(x, kernel, padding='VALID', impl=impl)
  assert y.dtype == jnp.bfloat16
  assert float(y[0, 0, 0, 0]) == float(jnp.bfloat16(49 * (1.0 + 2.0**-7)))


def test_module_has_nn_conv_parameters_under_either_impl():
  x = jnp.ones((1, 6, 6, 4))
  reference = nn.Conv(4, (3, 3), feature_group_count=4, use_bias=False)
  ref = reference.init(jax.random.key(3), x)['params']
  for impl in dw.IMPLS:
    params = dw.DepthwiseConv(3, impl=impl).init(jax.random.key(3), x)['params']
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, ref)
    np.testing.assert_array_equal(params['kernel'], ref['kernel'])
    np.testing.assert_allclose(
      dw.DepthwiseConv(3, impl=impl).apply({'params': ref}, x),
      reference.apply({'params': ref}, x),
      atol=1e-5,
    )


def test_unknown_impl_is_refused():
  with pytest.raises(ValueError, match='cudnn, shifts'):
    dw.depthwise_conv(jnp.ones((1, 3, 3, 1)), jnp.ones((3, 3, 1, 1)), impl='winograd')


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_stylegan_blur_shifts_match_the_grouped_convolution(dtype):
  x = jax.random.normal(jax.random.key(2), (2, 8, 6, 3)).astype(dtype)
  a, b = sl.blur(x, 'shifts'), sl.blur(x, 'cudnn')
  assert a.dtype == b.dtype == dtype
  tol = 1e-6 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(a.astype(jnp.float32), b.astype(jnp.float32), atol=tol)

  def loss(x, impl):
    return jnp.sum(jnp.sin(sl.blur(x, impl)))

  x32 = x.astype(jnp.float32)
  np.testing.assert_allclose(jax.grad(loss)(x32, 'shifts'), jax.grad(loss)(x32, 'cudnn'), atol=1e-5)


def test_an_unknown_blur_impl_is_refused():
  with pytest.raises(ValueError, match='blur impl must be one of cudnn, shifts'):
    sl.blur(jnp.ones((1, 6, 6, 2)), 'winograd')
