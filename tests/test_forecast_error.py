"""scripts/forecast_error.py: deviceless forecasts matched with on-device ones, batch by batch."""

import importlib.util
import json
import os

_PATH = os.path.join(os.path.dirname(__file__), '..', 'scripts', 'forecast_error.py')
_spec = importlib.util.spec_from_file_location('forecast_error', _PATH)
forecast_error = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(forecast_error)


def _record(peaks, deviceless, **changes):
  r = {
    'workload': 'stylegan',
    'precision': 'fp32',
    'tiny': False,
    'jax_version': '0.11.2',
    'xla_flags': '--xla_gpu_enable_triton_gemm=false',
    'config': {'resolution': 1024},
    'device': {'kind': 'NVIDIA H200', **({'deviceless': True} if deviceless else {})},
    'search': {'trials': [{'examples': n, 'predicted_peak_bytes': p} for n, p in peaks.items()]},
  }
  r.update(changes)
  return r


def _write(path, records):
  with open(path, 'w') as f:
    f.write(''.join(json.dumps(r) + '\n' for r in records))
  return str(path)


def test_only_the_same_program_at_the_same_batch_is_compared(tmp_path, capsys):
  less = _write(
    tmp_path / 'd.jsonl',
    [
      _record({88: 142_000_000_000, 61: 97_000_000_000}, True),
      _record({88: 1}, True, xla_flags='--xla_gpu_autotune_level=1'),  # another compiler setting
      _record({88: 2}, False),  # compiled on the GPU: not a deviceless forecast
    ],
  )
  gpu = _write(tmp_path / 'g.jsonl', [_record({88: 149_000_000_000, 82: 141_000_000_000}, False)])
  assert forecast_error.main(['forecast_error.py', less, gpu]) == 0
  out = capsys.readouterr().out
  rows = [line for line in out.splitlines() if line.startswith('| stylegan')]
  assert rows == ['| stylegan fp32 | 88 | 149.000 | 142.000 | -7,000 | -4.70% |']
  assert '- stylegan fp32: largest gap -4.70% (at 88)' in out


def test_wrong_arguments_exit_2(capsys):
  assert forecast_error.main(['forecast_error.py']) == 2
