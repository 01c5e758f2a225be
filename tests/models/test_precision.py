"""The fp16 loss scale each workload starts from: its 2020 reference's, else TensorFlow's."""

import jax
import pytest

from models import precision, registry


def _scale(name):
  w = registry.get(name)
  state = jax.jit(w.trainer(w.resolve(tiny=True), precision.get('fp16')).init)(jax.random.key(0))
  return float(state.loss_scale.scale), state.loss_scale.growth_interval


def test_transformer_big_starts_from_fairseqs_loss_scale():
  """fairseq on one GPU: --fp16-init-scale 2**7, a doubling after 2**14 finite updates."""
  assert _scale('transformer_big') == (128.0, 16384)


def test_other_workloads_start_from_tensorflows_loss_scale():
  """Keras' LossScaleOptimizer defaults: 2**15, a doubling after 2000 finite steps."""
  assert _scale('bert_base') == (32768.0, 2000)


@pytest.mark.parametrize('name', ['fp32', 'tf32', 'bf16'])
def test_only_fp16_scales_the_loss(name):
  assert precision.get(name).with_loss_scale(2.0**7, 2**14).initial_scale() is None
