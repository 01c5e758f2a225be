"""python -m jaxbench.matmul_benchmark: the matrix-product rate of each precision policy, with the
policy's matmul precision, and bad input refused in one line."""

import subprocess
import sys

import jax
import jax.numpy as jnp

from jaxbench import matmul_benchmark as bench
from models import precision


def test_each_policy_multiplies_as_the_workloads_do():
  def text(name):
    policy = precision.get(name)
    a = jnp.ones((8, 8), policy.compute_dtype)
    return bench.lower(policy, a, a).as_text()

  assert 'HIGHEST' in text('fp32')  # full float32, no TF32
  assert 'HIGHEST' not in text('tf32')
  assert 'bf16' in text('bf16') and 'f16' in text('fp16').replace('bf16', '')


def test_a_row_per_precision_with_its_median_between_its_extremes():
  r = bench.rates('bf16', size=32, products=3, pairs=2, repeats=3)
  assert len(r['rates']) == 3 and min(r['rates']) > 0 and r['compile_s'] > 0
  table = bench.rows(['fp32', 'bf16'], size=32, products=3, pairs=2, repeats=3)
  assert [row[:3] for row in table] == [
    (jax.devices()[0].device_kind, 'fp32', 32),
    (jax.devices()[0].device_kind, 'bf16', 32),
  ]
  for row in table:
    median, lowest, highest = map(float, row[3:6])
    assert 0 < lowest <= median <= highest


def test_the_command_prints_its_table_and_refuses_bad_input_in_one_line():
  cmd = [sys.executable, '-m', 'jaxbench.matmul_benchmark', '--size=16', '--products=2']
  ok = subprocess.run(cmd + ['--repeats=2', '--precisions=tf32'], capture_output=True, text=True)
  assert ok.returncode == 0, ok.stderr
  header, row = ok.stdout.splitlines()
  assert header.split()[:3] == ['device', 'precision', 'size']
  assert row.split()[-6:-4] == ['tf32', '16']  # after the device's name, which has spaces on a GPU
  for bad in ['--size=0', '--precisions=fp8', '--repeats=-1', 'extra']:
    r = subprocess.run(cmd + [bad], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == '', (bad, r.stdout)
    assert len(r.stderr.splitlines()) == 1 and 'jaxbench.matmul_benchmark: error:' in r.stderr
