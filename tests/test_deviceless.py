"""--compile_for: flag handling everywhere; the deviceless compile itself where JAX's CUDA
plugin is installed (the README's test command installs none, so CI checks the refusal)."""

import os
import subprocess
import sys

import jax
import pytest

from jaxbench.cards import deviceless, emulation
from jaxbench.core import program as prog
from models import precision, registry
from models.layers import attention
from tests import test_catalog

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flags(**kw):
  """test_catalog's flags, asking for a deviceless prediction of the eight 2020 cards."""
  return test_catalog._flags(
    **{'gpus': ('lambda2020',), 'predict': True, 'compile_for': 'h200', **kw}
  )


def _cuda_target():
  """The H200 as a compile target, or None where JAX has no CUDA plugin."""
  try:
    return deviceless.device('h200')
  except deviceless.DevicelessError:
    return None


def _cuda_target_or_skip():
  """The H200 as a compile target; the test is skipped where JAX has no CUDA plugin."""
  target = _cuda_target()
  if target is None:
    pytest.skip("JAX's CUDA plugin is not installed (pip install -e '.[cuda]')")
  return target


def test_a_prediction_may_name_its_target():
  req = emulation.request(_flags())
  assert req.kind == emulation.PREDICT and req.target == 'h200' and len(req.gpus) == 8


@pytest.mark.parametrize(
  'kw, says',
  [
    (dict(compile_for='b9000'), "unknown target 'b9000'; known: h200"),
    (dict(predict=False, gpus=(), gpu='t4'), '--compile_for only predicts'),
    (dict(store='x.jsonl'), '--compile_for only predicts'),
  ],
)
def test_compile_for_refuses_what_it_cannot_do(kw, says):
  with pytest.raises(ValueError, match=says):
    emulation.request(_flags(**kw))


def test_every_target_describes_a_gpu():
  for name, file in deviceless.TARGETS.items():
    with open(os.path.join(ROOT, 'jaxbench', 'data', 'targets', file)) as f:
      text = f.read()
    assert 'core_count:' in text and 'device_memory_size:' in text, name
    assert 'cuda_compute_capability' in text and 'device_description_str:' in text, name


def test_without_the_cuda_plugin_the_command_says_so_in_one_line(tmp_path):
  if _cuda_target() is not None:
    pytest.skip("JAX's CUDA plugin is installed here: the refusal cannot happen")
  out = tmp_path / 'r.jsonl'
  r = subprocess.run(
    [
      sys.executable,
      '-m',
      'jaxbench.main',
      '--model=bert_base',
      '--predict',
      '--gpu=t4',
      '--compile_for=h200',
      f'--output={out}',
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 2, r.stderr
  lines = [line for line in r.stderr.splitlines() if line.startswith('jaxbench: error:')]
  assert len(lines) == 1 and "needs JAX's CUDA plugin" in lines[0], r.stderr
  assert 'Traceback' not in r.stderr and not out.exists()


def test_prepare_holds_jax_to_the_cpu_when_jax_was_imported_first():
  """A run imports JAX (jaxbench.core.mesh) before it prepares a deviceless compile; JAX read
  JAX_PLATFORMS then, so prepare must set its config too, or the CUDA plugin starts (and on a
  host without a GPU fails, losing the target)."""
  code = (
    'import os, jax\n'
    'from jaxbench.core import mesh\n'
    'from jaxbench.cards import deviceless\n'
    'deviceless.prepare()\n'
    'print(jax.config.jax_platforms, os.environ["JAX_PLATFORMS"])\n'
  )
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  done = subprocess.run(
    [sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=120
  )
  assert done.stdout.split() == ['cpu', 'cpu'], done.stderr[-2000:]


def test_a_step_compiles_for_the_h200_without_one():
  target = _cuda_target_or_skip()
  assert target.device_kind == 'NVIDIA H200'
  assert jax.devices()[0].platform == 'cpu'  # nothing runs on the described GPU
  w = registry.get('bert_base')
  cfg = w.resolve(tiny=True, overrides={})
  on_gpu = prog.Program(w, cfg, precision.get('fp32'), target=target)
  one, four = on_gpu.compile(1), on_gpu.compile(4)
  assert 0 < one.peak_bytes < four.peak_bytes
  gpu_code = one.executable.as_text()  # matmuls as cuBLAS calls or Triton kernels: GPU code
  assert '__cublas$' in gpu_code or '__triton' in gpu_code
  info = deviceless.device_info(target)
  assert info['deviceless'] and info['kind'] == 'NVIDIA H200' and info['platform'] == 'gpu'


@pytest.mark.parametrize(
  'policy, seq_len, fused',
  [
    ('bf16', 16, True),
    ('tf32', attention.TF32_FUSED_MIN_KEYS, True),
    ('tf32', attention.TF32_FUSED_MIN_KEYS // 2, False),
    ('fp32', attention.TF32_FUSED_MIN_KEYS, False),
  ],
)
def test_auto_attention_compiled_for_a_gpu_follows_the_policy(policy, seq_len, fused):
  """attention_probs='auto' is chosen as the program is lowered, under the policy's compute dtype
  and matrix-product precision and the keys' length: the fused kernels (Triton) in a bf16 program
  compiled for the H200 from this CPU and in a tf32 one with long enough keys, XLA's saved
  attention in an fp32 one and a tf32 one with short keys (and in any compiled for the CPU: see
  tests/models/test_fused_attention.py)."""
  target = _cuda_target_or_skip()
  w = registry.get('bert_base')

  def triton_kernels(probs):
    cfg = w.resolve(
      tiny=True, overrides={'attention_probs': probs, 'seq_len': seq_len, 'max_positions': seq_len}
    )
    on_gpu = prog.Program(w, cfg, precision.get(policy), target=target)
    return on_gpu.compile(2).executable.as_text().count('__gpu$xla.gpu.triton')

  auto, saved = triton_kernels('auto'), triton_kernels('saved')
  assert auto > saved if fused else auto == saved


def test_the_report_tells_deviceless_predictions_apart():
  from jaxbench.results import tables  # pylint: disable=g-import-not-at-top

  on_gpu = {'mode': 'predict', 'precision': 'fp32', 'device': {'kind': 'NVIDIA H200'}}
  off_gpu = {**on_gpu, 'device': {'kind': 'NVIDIA H200', 'deviceless': True}}
  assert tables.source_label(on_gpu) == 'predicted fp32'
  assert tables.source_label(off_gpu) == 'predicted (deviceless) fp32'


def _init_text(target, name, kernels: bool) -> str:
  """The initialization of tiny `name` lowered for `target`, with or without threefry kernels."""
  w = registry.get(name)
  program = prog.Program(w, w.resolve(tiny=True, overrides={}), precision.get('fp32'))
  key = jax.eval_shape(lambda: jax.random.key(0))
  key = jax.ShapeDtypeStruct(
    key.shape, key.dtype, sharding=jax.sharding.SingleDeviceSharding(target)
  )
  init = jax.jit(program.trainer.init)
  if kernels:
    with prog.threefry_as_kernels():
      return init.trace(key).lower().as_text()
  return init.trace(key).lower().as_text()


def test_the_initial_state_draws_threefry_as_kernels_on_a_gpu():
  target = _cuda_target_or_skip()
  assert 'cu_threefry2x32' in _init_text(target, 'bert_base', kernels=True)
  assert 'cu_threefry2x32' not in _init_text(target, 'bert_base', kernels=False)


def test_the_encoder_keeps_the_batch_major_on_a_gpu():
  """bert_base at full size, compiled for the H200: every array of the encoder in [B, L, ...]
  order. When the position table's gradient was a reduction over the batch, XLA's GPU layout
  assignment put the batch minor throughout ([L, H, B]) and each LayerNorm transposed."""
  target = _cuda_target_or_skip()
  w = registry.get('bert_base')
  cfg = w.resolve(tiny=False, overrides={})
  text = prog.Program(w, cfg, precision.get('tf32'), target=target).compile(64).executable.as_text()
  length, hidden = cfg['seq_len'], cfg['hidden']
  assert f'f32[64,{length},{hidden}]' in text
  assert f'f32[{length},{hidden},64]' not in text  # the residual stream with the batch minor
  assert f'f32[{length},64]' not in text  # LayerNorm's statistics in [L, B] order


def test_transformer_big_in_multiples_of_8_sentences_pads_no_matrix_product():
  """In fp16 and bf16 XLA pads each matrix product's dimensions to multiples of 8 for the
  tensor cores, copying the operand; at 30 tokens a sentence, 9 sentences (270 tokens) pad the
  token dimension of every product, 8 (240) none: why transformer_big runs fairseq's multiples
  of 8 (its batch_multiple)."""
  target = _cuda_target_or_skip()
  w = registry.get('transformer_big')
  cfg = w.resolve(tiny=False, overrides={})
  step = prog.Program(w, cfg, precision.get('bf16'), target=target)
  step.compiler_options = {'xla_gpu_enable_triton_gemm': False}  # a run's default: cuBLAS
  assert 'bf16[272,1024]' in step.compile(9).executable.as_text()  # 270 tokens padded to 272
  assert 'bf16[248,1024]' not in step.compile(8).executable.as_text()
