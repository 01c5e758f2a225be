"""ConvS2S (fairseq fconv_wmt_en_de): parameter count, causal decoder, gradient scaling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import ad_checkpoint

from models import precision
from models import workload as wl
from models.conv_seq2seq import fconv


def _fairseq_params(src_vocab=42243, tgt_vocab=43676, embed=768, out_embed=512, positions=1024):
  """fairseq's fconv_wmt_en_de from the layer shapes of fairseq/models/fconv.py, with the
  dictionaries of the pretrained wmt14.en-de.fconv-py model (en 42,243, de 43,676 types).
  Every Linear and convolution is weight-normalised (v, one gain per output, a bias); fconv's
  own PositionalEmbedding holds `positions` rows; embeddings are not normalised."""
  linear = lambda cin, cout: cin * cout + 2 * cout
  conv = lambda k, cin, cout: k * cin * 2 * cout + 2 * 2 * cout  # GLU: 2C outputs
  layers = [(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2

  def convolutions(attention):
    count, c = 0, layers[0][0]
    for cout, k in layers:
      count += (linear(c, cout) if c != cout else 0) + conv(k, c, cout)  # residual projection
      count += linear(cout, embed) + linear(embed, cout) if attention else 0
      c = cout
    return count

  encoder = (src_vocab + positions) * embed + linear(embed, 512) + convolutions(False)
  encoder += linear(2048, embed)
  decoder = (tgt_vocab + positions) * embed + linear(embed, 512) + convolutions(True)
  decoder += linear(2048, out_embed) + linear(out_embed, tgt_vocab)
  return encoder + decoder


@pytest.fixture(scope='module')
def tiny():
  """The tiny model's config, batch and a jitted eval-mode forward, shared by the tests."""
  cfg = fconv.FCONV_WMT_EN_DE.resolve(tiny=True)
  model = fconv.FConv(cfg)
  batch = fconv.make_batch(cfg, jax.random.key(1), 2)
  variables = model.init(
    {'params': jax.random.key(0), 'dropout': jax.random.key(2)}, batch, train=False
  )
  return cfg, batch, jax.jit(lambda b: model.apply(variables, b, train=False))


def test_full_size_parameter_count_matches_fairseq():
  w = fconv.FCONV_WMT_EN_DE
  trainer = w.trainer(w.resolve(), precision.get('fp32'))
  shapes = jax.eval_shape(trainer.init, jax.random.key(0))
  assert wl.count_params(shapes.params) == _fairseq_params()
  # fairseq's weight norm keeps one gain per output channel of every convolution.
  conv = shapes.params['decoder']['conv_12']
  assert conv['v'].shape == (3, 1024, 2048) and conv['g'].shape == (2048,)


def test_decoder_does_not_see_the_future(tiny):
  cfg, batch, apply = tiny
  logits = apply(batch)
  t = cfg['tgt_len'] // 2
  changed = (
    batch['target_in']
    .at[:, t + 1 :]
    .set((batch['target_in'][:, t + 1 :] + 7) % (cfg['tgt_vocab'] - 1) + 1)
  )
  assert not np.array_equal(changed, batch['target_in'])
  new_logits = apply({**batch, 'target_in': changed})
  np.testing.assert_array_equal(new_logits[:, : t + 1], logits[:, : t + 1])
  # The later positions do read the changed tokens, so the check above is not vacuous.
  assert not np.allclose(new_logits[:, t + 1 :], logits[:, t + 1 :])


def test_every_target_position_attends_to_the_whole_source(tiny):
  cfg, batch, apply = tiny
  last = batch['source'].at[:, -1].set(batch['source'][:, -1] % (cfg['src_vocab'] - 1) + 1)
  assert not np.array_equal(last, batch['source'])
  diff = np.abs(apply({**batch, 'source': last}) - apply(batch)).max(axis=(0, 2))
  assert np.all(diff > 0), diff  # even the first target step sees the last source token


def test_grad_multiply_scales_only_the_gradient():
  x = jnp.arange(3.0)
  np.testing.assert_array_equal(fconv.grad_multiply(x, 0.25), x)
  grad = jax.grad(lambda v: (fconv.grad_multiply(v, 0.25) ** 2).sum())(x)
  np.testing.assert_allclose(grad, 0.25 * 2 * x)


@pytest.mark.parametrize('impl', fconv.CONV_IMPLS)
@pytest.mark.parametrize('kernel, causal', [(3, False), (3, True), (1, False), (4, True)])
def test_the_gemm_convolution_equals_a_convolution(kernel, causal, impl):
  """fconv's ConvTBC-style GEMMs are the 'same' (or causal) convolution, values and grads."""
  x = jax.random.normal(jax.random.key(0), (2, 7, 5))
  w = jax.random.normal(jax.random.key(1), (kernel, 5, 6))
  left = kernel - 1 if causal else kernel // 2

  def reference(x, w):
    return jax.lax.conv_general_dilated(
      x, w, (1,), ((left, kernel - 1 - left),), dimension_numbers=('NWC', 'WIO', 'NWC')
    )

  np.testing.assert_allclose(
    fconv.temporal_conv(x, w, causal, impl), reference(x, w), rtol=1e-5, atol=1e-5
  )
  loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))  # noqa: E731
  got = jax.grad(loss(lambda x, w: fconv.temporal_conv(x, w, causal, impl)), argnums=(0, 1))(x, w)
  want = jax.grad(loss(reference), argnums=(0, 1))(x, w)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('causal', [False, True])
def test_the_gemm_convolution_keeps_only_its_input_and_kernel_for_backward(causal, capsys):
  """ConvTBC's memory: the K-times-wider shifted copy is rebuilt in the backward pass, not saved."""
  x = jnp.ones((2, 7, 5))
  w = jnp.ones((3, 5, 6))
  ad_checkpoint.print_saved_residuals(lambda x, w: fconv.temporal_conv(x, w, causal, 'gemm'), x, w)
  saved = capsys.readouterr().out.strip().splitlines()
  assert saved == ['f32[2,7,5] from the argument x', 'f32[3,5,6] from the argument w']


def test_the_conv_impl_is_a_config_choice():
  w = fconv.FCONV_WMT_EN_DE
  assert w.resolve(overrides={'conv_impl': 'xla'})['conv_impl'] == 'xla'
  with pytest.raises(ValueError, match='conv_impl must be one of gemm, xla'):
    w.resolve(overrides={'conv_impl': 'cudnn'})
