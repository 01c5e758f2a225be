"""Search hints: which earlier results may aim a search (the same program, compiler and device)."""

import json

from jaxbench import hints


def _record(**changes):
  r = {
    'schema': 'jaxbench.result/1',
    'workload': 'bert_base',
    'workload_revision': 2,
    'precision': 'fp32',
    'tiny': False,
    'jax_version': '0.11.2',
    'xla_flags': '--xla_disable_hlo_passes=rematerialization',
    'config': {'seq_len': 128, 'dims': (768, 12)},
    'device': {'platform': 'gpu', 'kind': 'NVIDIA H200', 'pool_bytes': 23899144192},
    'search': {
      'trials': [
        {'examples': 1, 'predicted_peak_bytes': 1480},
        {'examples': 188, 'predicted_peak_bytes': 23906},
        {'examples': 5, 'predicted_peak_bytes': None},  # an OOM at compile time: no forecast
      ]
    },
  }
  r.update(changes)
  return r


def test_only_the_same_program_compiler_and_device_count(tmp_path):
  path = tmp_path / 'earlier.jsonl'
  others = [
    _record(precision='bf16'),
    _record(jax_version='0.10.2'),
    _record(xla_flags=''),  # rematerialization allowed: another program
    _record(config={'seq_len': 512, 'dims': (768, 12)}),
    _record(device={'platform': 'gpu', 'kind': 'NVIDIA A100'}),
    _record(workload='bert_squad'),
    _record(workload_revision=1),  # the model's program changed since
    _record(tiny=True),
  ]
  lines = [json.dumps(r) for r in [_record(), *others]]
  path.write_text('\n'.join(lines) + '\n{"cut short')
  # The run asking differs only in its memory pool (another budget), which forecasts ignore.
  head = _record(device={'platform': 'gpu', 'kind': 'NVIDIA H200', 'pool_bytes': 142606336000})
  peaks, matched = hints.load([str(path)], head)
  assert matched == 1
  assert peaks == {1: 1480, 188: 23906}


def test_no_files_no_hints():
  assert hints.load([], _record()) == ({}, 0)


def test_results_from_before_revisions_count_as_revision_one(tmp_path):
  path = tmp_path / 'old.jsonl'
  old = _record()
  del old['workload_revision']
  path.write_text(json.dumps(old) + '\n')
  assert hints.load([str(path)], _record(workload_revision=1))[1] == 1
  assert hints.load([str(path)], _record(workload_revision=2))[1] == 0


def test_a_cache_location_is_not_a_compiler_setting(tmp_path):
  """--autotune_cache_dir changes where autotuning results come from, not what is compiled."""
  cached = '--xla_disable_hlo_passes=rematerialization --xla_gpu_per_fusion_autotune_cache_dir=/c'
  path = tmp_path / 'earlier.jsonl'
  path.write_text(
    json.dumps(_record(xla_flags=cached))
    + '\n'
    + json.dumps(_record(xla_flags=cached + ' --xla_gpu_autotune_level=0'))  # another setting
    + '\n'
  )
  assert hints.load([str(path)], _record()) == ({1: 1480, 188: 23906}, 1)
  assert hints.compiler_flags(cached) == '--xla_disable_hlo_passes=rematerialization'
