"""python -m jaxbench.attention_benchmark: every form of the BERT family's attention timed on the
same inputs, checked against the gradients of the same dropout decisions in XLA's kernels, and bad
input refused in one line."""

import subprocess
import sys

import pytest

from jaxbench import attention_benchmark as bench

TILING = dict(block_q=16, block_k=16, block_bwd=16, warps=2, warps_bwd=2, stages=1)


def test_the_encoder_workloads_are_the_bert_family():
  assert bench.encoder_models() == ['bert_base', 'bert_squad', 'mt_dnn']


def test_full_size_shapes_are_the_comparison_batches():
  assert bench.shape('bert_base', tiny=False) == (64, 128, 12, 64, 0.1)
  assert bench.shape('bert_squad', tiny=False) == (32, 384, 12, 64, 0.1)
  assert bench.shape('mt_dnn', tiny=False) == (8, 512, 16, 64, 0.1)


def test_every_form_is_timed_and_computes_the_gradients_of_its_dropout_decisions():
  table = bench.rows(['bert_base'], ['fp32'], [TILING], True, warmup=1, steps=2, windows=2)
  assert [r[3:5] for r in table] == [
    ('saved', ''),
    ('recomputed', ''),
    ('fused, bernoulli', '32,32,32,4,4,2 (default)'),  # full float32's tiles
    ('fused, grouped', '32,32,32,4,4,2 (default)'),
    ('fused', '16,16,16,2,2,1'),
  ]
  saved, *others = table
  assert float(saved[5]) > 0 and saved[8] == ''
  for row in others:
    ms, ratio = row[5].split()
    assert float(ms) > 0 and ratio.startswith('(') and ratio.endswith('x)')
    assert float(row[8]) < 1e-5, row  # the same dropout, so the same gradients up to rounding


def test_the_grouped_draw_is_checked_against_its_own_decisions_not_flaxs():
  """Four decisions a hash are not jax.random.bernoulli's: the grouped row's check is against
  reference_attention, which draws them, and the saved form's gradients are far from them."""
  dims = bench.shape('bert_base', tiny=True)

  def grads(form):
    compiled, args, _ = bench.gradient(form, None, dims, 'float32', 'float32')
    return compiled(*args)

  fused = grads('fused, grouped')
  assert bench.difference(fused, grads(bench.REFERENCE)) < 1e-5
  assert bench.difference(fused, grads('saved')) > 1e-2


def test_a_tiling_that_fails_gets_a_row_that_says_why(monkeypatch):
  gradient = bench.gradient

  def no_room(form, tiling, *args):
    if tiling is not None:
      raise RuntimeError('Shared memory size limit exceeded: 262144 > 232448\nmore')
    return gradient(form, tiling, *args)

  monkeypatch.setattr(bench, 'gradient', no_room)
  table = bench.rows(['bert_base'], ['fp32'], [TILING], True, warmup=0, steps=1, windows=1)
  assert len(table) == 5 and all(len(r) == 9 for r in table[:4])
  assert table[4][5:] == (
    'failed: RuntimeError: Shared memory size limit exceeded: 262144 > 232448',
  )


@pytest.mark.parametrize(
  'args, message',
  [
    (['--models=bert_base,transformer_big'], 'not a BERT encoder workload: transformer_big'),
    (['--blocks=64,64'], 'six positive integers'),
    (['--blocks=48,64,64,4,4,2'], 'powers of two'),
    (['--precisions=fp8'], 'each must be one of'),
    (['--steps=0'], 'not a positive integer'),
  ],
)
def test_bad_input_is_refused_in_one_line(args, message):
  r = subprocess.run(
    [sys.executable, '-m', 'jaxbench.attention_benchmark', *args], capture_output=True, text=True
  )
  assert r.returncode == 2 and r.stdout == ''
  assert r.stderr.count('\n') == 1 and message in r.stderr, r.stderr


def test_both_benchmarks_load_in_one_process():
  """They share --models (flags/benchmarks.py): absl refuses a flag defined twice."""
  code = 'import jaxbench.attention_benchmark, jaxbench.init_benchmark'
  r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
