"""Every registered workload at its tiny preset: builds, steps, and learns a fixed batch."""

import jax
import numpy as np
import pytest

from models import precision, registry
from tests import tiny as shared

LEARN_STEPS = 30


def _tiny_trainer(w, policy='fp32'):
  return w.trainer(w.resolve(tiny=True), precision.get(policy))


@pytest.mark.parametrize('name', registry.names())
def test_loss_falls_on_a_fixed_batch(name):
  w = registry.get(name)
  rng = jax.random.key(0)
  state, batch = shared.start(name)
  losses = []
  for _ in range(LEARN_STEPS):
    state, metrics = shared.tiny(name).step(state, batch, rng)
    losses.append(float(metrics['loss']))
  assert np.all(np.isfinite(losses)), losses
  if w.adversarial:
    return  # tests/models checks each network's loss with the other frozen
  # Dropout makes single steps noisy: compare the means of the first and last five.
  assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses


@pytest.mark.parametrize('name', registry.names())
def test_describe_counts_without_allocating(name):
  w = registry.get(name)
  trainer = _tiny_trainer(w)
  shapes = jax.eval_shape(trainer.init, jax.random.key(0))
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(shapes))
  assert w.flops_per_example(w.resolve(tiny=True)) > 0
  assert w.example_size(w.config) >= 1


def test_fairseqs_workloads_run_sentences_in_multiples_of_8():
  from jaxbench.core import run_record  # pylint: disable=g-import-not-at-top

  for name in ('transformer_big', 'conv_seq2seq'):
    w = registry.get(name)
    cfg = w.resolve()
    # fairseq's --max-tokens 16384 at 30 tokens a sentence: 546 sentences, cut to 544.
    assert w.batch_multiple == 8 and run_record.examples_for(w, cfg, 16_384) == 544
    assert run_record.examples_for(w, cfg, 7 * 30 + 29) == 7  # below 8, any number
    assert run_record.examples_for(w, cfg, 8 * 30 - 1) == 7
  bert = registry.get('bert_base')
  assert bert.batch_multiple == 1 and run_record.examples_for(bert, bert.resolve(), 65) == 65
