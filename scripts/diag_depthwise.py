"""Where does a first step of a depthwise-convolution network spend its time, fp32 against bf16?

Session 8 saw nasnet_large bf16 at 360 images compile in 324 s and then sit in its first step
for more than 190 s with the GPU idle (0% utilization); deeplabv3 bf16 did not finish its first
probe in 530 s. Both are built of depthwise-separable convolutions; the bf16 workloads without
them (yolov3, mask_rcnn) ran at once. This times, for a stack of depthwise 3x3/5x5/7x7
convolutions of several channel counts (a train step: forward and backward), the compile, the
first call and the second call, and the process CPU time during the first call (host work, such
as cuDNN building kernels, shows as CPU time with the GPU idle).

  python3 scripts/diag_depthwise.py [BATCH] [HW] [IMPL,...]

IMPL: lax (XLA's grouped convolution, cuDNN on a GPU), shifted (models/depthwise.py's 'shifts',
taps stacked on a minor axis), per_tap (session 8's first shifted version) or tap_major (taps
stacked on a major axis); all four without a third argument. Session 13 at 128 images, 42x42,
bf16: 3.62, 301.31 and 17.52 ms a step for the first three. Run from the repository root
(PYTHONPATH=.).
"""

import resource
import sys
import time

import jax
import jax.numpy as jnp

from models import depthwise


def cpu_s() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def lax_depthwise(x, k):
  """XLA's grouped convolution (feature_group_count = channels): cuDNN on a GPU."""
  return depthwise.depthwise_conv(x, k, padding='SAME', impl='cudnn')


def shifted_depthwise(x, k):
  """The same convolution as models/depthwise.py computes it: taps stacked on a minor axis."""
  return depthwise.depthwise_conv(x, k, padding='SAME', impl='shifts')


def tap_major_depthwise(x, k):
  """Taps stacked on a new major axis instead (untimed so far): the weight gradient then reduces
  with channels minor, as each of per_tap's reductions does, but in one fusion."""
  kh, kw = k.shape[0], k.shape[1]
  ph, pw = kh // 2, kw // 2
  h, w = x.shape[1], x.shape[2]
  xp = jnp.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
  patches = jnp.stack([xp[:, i : i + h, j : j + w, :] for i in range(kh) for j in range(kw)])
  taps = k.reshape(kh * kw, 1, 1, 1, -1).astype(jnp.float32)
  return jnp.sum(patches.astype(jnp.float32) * taps, axis=0).astype(x.dtype)


def per_tap_depthwise(x, k):
  """Session 8's first version: one shifted product per tap, summed in the input's dtype."""
  kh, kw = k.shape[0], k.shape[1]
  ph, pw = kh // 2, kw // 2
  h, w = x.shape[1], x.shape[2]
  xp = jnp.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
  out = 0
  for i in range(kh):
    for j in range(kw):
      out = out + xp[:, i : i + h, j : j + w, :] * k[i, j, 0, :]
  return out


def build(batch: int, hw: int, dtype, conv):
  layers = [(3, 64), (5, 96), (7, 128), (3, 168), (5, 336), (7, 84), (3, 728), (5, 42)]
  keys = jax.random.split(jax.random.key(0), len(layers) + 1)
  params = [jax.random.normal(k, (s, s, 1, c), dtype) * 0.1 for k, (s, c) in zip(keys, layers)]
  xs = [jax.random.normal(keys[-1], (batch, hw, hw, c), dtype) for _, c in layers]

  def loss(params, xs):
    total = 0.0
    for p, x in zip(params, xs):
      y = conv(x, p)
      total = total + jnp.mean(jnp.square(y.astype(jnp.float32)))
    return total

  step = jax.jit(jax.value_and_grad(loss))  # the inputs are arguments, not captured constants
  return step, params, xs


def main() -> None:
  batch = int(sys.argv[1]) if len(sys.argv) > 1 else 32
  hw = int(sys.argv[2]) if len(sys.argv) > 2 else 83
  print(f'jax {jax.__version__}, {jax.devices()[0].device_kind}, batch {batch}, {hw}x{hw}')
  impls = (
    ('lax', lax_depthwise),
    ('shifted', shifted_depthwise),
    ('per_tap', per_tap_depthwise),
    ('tap_major', tap_major_depthwise),
  )
  only = sys.argv[3].split(',') if len(sys.argv) > 3 else None
  for name, conv in impls:
    if only and name not in only:
      continue
    for dtype in (jnp.float32, jnp.bfloat16):
      step, params, xs = build(batch, hw, dtype, conv)
      t = time.perf_counter()
      compiled = step.lower(params, xs).compile()
      compile_s = time.perf_counter() - t
      c0, t = cpu_s(), time.perf_counter()
      jax.block_until_ready(compiled(params, xs))
      first_s, first_cpu = time.perf_counter() - t, cpu_s() - c0
      t = time.perf_counter()
      for _ in range(5):
        out = compiled(params, xs)
      jax.block_until_ready(out)
      step_s = (time.perf_counter() - t) / 5
      print(
        f'{name:8s} {jnp.dtype(dtype).name:8s} compile {compile_s:7.2f} s  first call '
        f'{first_s:7.2f} s (process CPU {first_cpu:7.2f} s)  then {step_s * 1e3:8.2f} ms a step',
        flush=True,
      )


if __name__ == '__main__':
  main()
