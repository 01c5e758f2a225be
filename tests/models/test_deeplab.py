"""DeepLabv3+ Xception-65: parameter counts, shapes at 513, the ignore label, aligned resize."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import precision
from models import workload as wl
from models.deeplab import deeplab, xception
from models.layers import depthwise

CFG = deeplab.DEEPLABV3.resolve()
TINY = deeplab.DEEPLABV3.resolve(tiny=True)


def _separable(cin, cout):
  """Parameters of DeepLab's split separable conv: depthwise 3x3 + BN, pointwise + BN."""
  return 9 * cin + 2 * cin + cin * cout + 2 * cout


def _reference_xception65_params():
  """Xception-65 as deeplab/core/xception.py lists it: weights plus BN beta and gamma."""
  count = 3 * 3 * 3 * 32 + 2 * 32 + 3 * 3 * 32 * 64 + 2 * 64  # entry_flow/conv1_1, conv1_2
  cin = 64
  blocks = (
    [((128, 128, 128), True), ((256, 256, 256), True), ((728, 728, 728), True)]
    + [((728, 728, 728), False)] * 16
    + [((728, 1024, 1024), True), ((1536, 1536, 2048), False)]
  )
  for depths, conv_shortcut in blocks:
    count += _separable(cin, depths[0]) + _separable(depths[0], depths[1])
    count += _separable(depths[1], depths[2])
    if conv_shortcut:
      count += cin * depths[2] + 2 * depths[2]
    cin = depths[2]
  return count


def test_param_counts():
  trainer = deeplab.DEEPLABV3.trainer(CFG, precision.get('fp32'))
  params = jax.eval_shape(trainer.init, jax.random.key(0)).params
  backbone = wl.count_params(params['xception_65'])
  assert backbone == _reference_xception65_params()
  # ASPP (image pooling, 1x1, three separable), projection, decoder and logits.
  head = (2048 * 256 + 512) * 2 + 3 * _separable(2048, 256) + (1280 * 256 + 512)
  head += (256 * 48 + 96) + _separable(304, 256) + _separable(256, 256) + 256 * 21 + 21
  assert wl.count_params(params) == backbone + head


def test_shapes_at_513():
  images = jax.ShapeDtypeStruct((1, 513, 513, 3), jnp.float32)
  (features, low_level), _ = jax.eval_shape(
    lambda x: xception.Xception65(CFG).init_with_output(jax.random.key(0), x, train=False), images
  )
  assert features.shape == (1, 33, 33, 2048)  # output stride 16
  assert low_level.shape == (1, 129, 129, 256)  # output stride 4
  batch = {'images': images}
  logits, _ = jax.eval_shape(
    lambda b: deeplab.DeepLabV3Plus(CFG).init_with_output(jax.random.key(0), b, train=False), batch
  )
  assert logits.shape == (1, 513, 513, 21)


def test_ignore_label_is_ignored():
  batch = jax.jit(lambda k: deeplab.make_batch(TINY, k, 2))(jax.random.key(0))
  loss = jax.jit(lambda logits: deeplab.loss(TINY, logits, batch)[0])
  labels = batch['labels']
  ignored = labels == deeplab.IGNORE_LABEL
  assert 0.02 < ignored.mean() < 0.6  # some void pixels, mostly real classes
  assert ((labels < TINY['classes']) | ignored).all()
  crop = TINY['crop']
  # numpy draws: eager threefry normals cost seconds of compile each on CPU.
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(2, crop, crop, TINY['classes'])), jnp.float32)
  value = loss(logits)
  noise = jnp.asarray(10 * rng.normal(size=logits.shape), jnp.float32)
  at_void = jnp.where(ignored[..., None], logits + noise, logits)
  np.testing.assert_allclose(loss(at_void), value, rtol=1e-6)
  at_valid = jnp.where(ignored[..., None], logits, logits + noise)
  assert abs(loss(at_valid) - value) > 1e-3


def test_resize_aligns_corners():
  x = jnp.arange(4.0).reshape(1, 2, 2, 1)
  y = deeplab.resize_bilinear(x, 3, 3)[0, :, :, 0]
  np.testing.assert_allclose(y, [[0, 0.5, 1], [1, 1.5, 2], [2, 2.5, 3]])
  # 33 -> 129: every fourth output is an input sample exactly.
  z = jnp.asarray(np.random.default_rng(0).normal(size=(1, 33, 33, 2)), jnp.float32)
  np.testing.assert_allclose(
    deeplab.resize_bilinear(z, 129, 129)[:, ::4, ::4], z, rtol=1e-5, atol=1e-6
  )


def test_weight_decay_skips_depthwise_and_batch_norm():
  params = jax.eval_shape(
    deeplab.DEEPLABV3.trainer(TINY, precision.get('fp32')).init, jax.random.key(0)
  ).params
  flat = jax.tree_util.tree_flatten_with_path(deeplab.decays(params))[0]
  names = {'/'.join(k.key for k in path): decayed for path, decayed in flat}
  assert names['xception_65/entry_flow_conv1_1/conv/kernel']
  assert names['logits/kernel'] and not names['logits/bias']
  assert not any(v for k, v in names.items() if 'depthwise/kernel' in k or '/bn/' in k)


def test_flops_match_deeplab_model_zoo():
  # deeplab/g3doc/model_zoo.md: xception65_coco_voc_trainaug, eval OS 16, one scale, 513x513:
  # 54.17B multiply-adds (convolutions; our resizes are matmuls counted on top).
  macs = deeplab.forward_flops(CFG, with_resizes=False) / 2
  np.testing.assert_allclose(macs, 54.17e9, rtol=0.005)


@pytest.mark.parametrize('impl', depthwise.IMPLS)
def test_every_depthwise_layer_takes_the_depthwise_choice(impl, monkeypatch):
  """`depthwise` reaches all 23 depthwise convolutions (models/layers/depthwise.py, whose tests
  compare the two forms' values and gradients at DeepLab's strides, rates and paddings); 'auto'
  sends the dilated ones (the exit flow's last block and ASPP) to shifted sums."""
  calls = []
  for name in ('_grouped', '_shifted_sum'):
    form = getattr(depthwise, name)
    monkeypatch.setattr(
      depthwise, name, lambda *a, f=form, n=name: calls.append((n, a[4])) or f(*a)
    )
  cfg = deeplab.DEEPLABV3.resolve(tiny=True, overrides={'depthwise': impl})
  batch = jax.eval_shape(lambda k: deeplab.make_batch(cfg, k, 2), jax.random.key(0))
  model = deeplab.DeepLabV3Plus(cfg)
  jax.eval_shape(lambda b: model.init(jax.random.key(1), b, train=False), batch)
  assert len(calls) == 23
  dilated = [rate > 1 for _, rate in calls]
  assert 0 < sum(dilated) < len(calls)
  if impl == 'auto':
    assert [n for n, _ in calls] == ['_shifted_sum' if d else '_grouped' for d in dilated]
  else:
    form = {'cudnn': '_grouped', 'shifts': '_shifted_sum'}[impl]
    assert [n for n, _ in calls] == [form] * 23
