"""scripts/autotune_log.py: reading XLA's autotuning log (jaxbench --autotune_log)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'scripts'))

import autotune_log  # noqa: E402

# The shape of an xla.AutotuningLogs text proto: an Any-typed instruction, candidates with a
# run time, one that failed its check, a nested key message.
LOG = '''
logs {
  instr {
    [type.googleapis.com/xla.gpu.ConvInstructionLog] {
      instruction { name: "conv.12" opcode: "custom-call" }
    }
  }
  results {
    scratch_bytes: 1024
    run_time { nanos: 3000000 }
    algorithm { algo_id: 5 math_type: TENSOR_OP_MATH }
  }
  results { run_time { nanos: 1000000 } algorithm { algo_id: 1 } }
  results { failure { kind: WRONG_RESULT msg: "it's off" } run_time { seconds: 2 } }
  cudnn_version { major: 9 minor: 10 }
}
logs {
  fusion_name: "cudnn_fusion.3"
  results { run_time { seconds: 1 nanos: 500000000 } }  # a slow candidate
}
'''


def test_it_reads_every_instruction_and_candidate():
  s = autotune_log.summarize(autotune_log.parse(LOG))
  assert (s['instructions'], s['candidates'], s['failures']) == (2, 4, 1)
  conv, fusion = s['rows']
  assert conv['label'] == 'conv.12' and fusion['label'] == 'cudnn_fusion.3'
  # a failed candidate's time is not a candidate's run time
  assert abs(conv['sum_s'] - 0.004) < 1e-12 and abs(conv['best_s'] - 0.001) < 1e-12
  assert abs(conv['first_s'] - 0.003) < 1e-12
  assert abs(s['sum_s'] - 1.504) < 1e-9
  table = autotune_log.render(s, top=5)
  assert table.index('cudnn_fusion.3') < table.index('conv.12')  # longest first


def test_a_broken_log_is_one_line_and_status_2(tmp_path):
  bad = tmp_path / 'bad.txt'
  bad.write_text('logs { results { run_time { nanos: 1 } }')  # unbalanced
  r = subprocess.run(
    [sys.executable, os.path.join(ROOT, 'scripts', 'autotune_log.py'), str(bad)],
    capture_output=True,
    text=True,
  )
  assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'unbalanced' in r.stderr


# XLA's autotuner of 2025 on (jax 0.11.2 on the H200) writes instruction_profiles instead.
PROFILES = '''
device: "ed0e56ab8b2a0ecb"
per_backend_versions { key: "CUDNN" value: "9.19.0" }
instruction_profiles {
  hlo_fingerprint: "03c3"
  config_profiles {
    config { backend: CUDNN backend_config { algorithm { algo_id: 28 } } }
    run_time { nanos: 272249450 }
  }
  config_profiles {
    config { backend: CUDNN backend_config { algorithm { algo_id: 22 } } }
    run_time { nanos: 600128 }
    scratch_bytes: 214327312
  }
  config_profiles {
    config { backend: CUDNN backend_config { algorithm { workspace_size { } } } }
    run_time { seconds: 2 nanos: 606488281 }
  }
  hlo_text: "CONV_593"
}
instruction_profiles {
  hlo_fingerprint: "0115"
  config_profiles { config { backend: NATIVE_EMITTER } run_time { nanos: 3424 } }
  hlo_text: "%input_transpose_fusion.10 = bf16[2048,3,3,1]{3,2,1,0} fusion(%p), kind=kInput"
}
'''.replace(
  'CONV_593',
  '%cudnn-conv.593 = (bf16[1,3,3,1536], u8[0]) custom-call(%a), feature_group_count=1536, '
  'metadata={op_name=\\"jit(step)/transpose(jvp(DeepLabV3Plus))/aspp1/depthwise/depthwise/'
  'conv_general_dilated\\" stack_frame_id=3}',
)


def test_it_reads_the_autotuners_instruction_profiles():
  s = autotune_log.summarize(autotune_log.parse(PROFILES))
  assert (s['instructions'], s['candidates'], s['failures']) == (2, 4, 0)
  conv, fusion = s['rows']
  assert (conv['label'], fusion['label']) == ('cudnn-conv.593', 'input_transpose_fusion.10')
  assert abs(conv['best_s'] - 600128e-9) < 1e-12 and abs(conv['first_s'] - 0.27224945) < 1e-12
  assert s['backends']['CUDNN'][0] == 3 and abs(s['backends']['CUDNN'][1] - 2.879337859) < 1e-9
  assert s['backends']['NATIVE_EMITTER'] == (1, 3424e-9)
  assert 'By backend: CUDNN 3 candidates' in autotune_log.render(s, top=5)
  assert (conv['groups'], fusion['groups']) == (1536, 1)
  assert conv['layer'] == 'backward: aspp1/depthwise/depthwise' and fusion['layer'] == ''
  assert s['grouped']['instructions'] == 1 and abs(s['grouped']['best_s'] - 600128e-9) < 1e-12
  assert s['ungrouped'] == {'instructions': 1, 'sum_s': 3424e-9, 'best_s': 3424e-9}
  by_best = autotune_log.render(s, top=5, sort='best').splitlines()
  assert by_best[-2].startswith('| cudnn-conv.593 | 1536 | backward: aspp1/depthwise/depthwise |')


def test_it_reads_a_gzipped_log(tmp_path):
  import gzip

  log = tmp_path / 'log.txt.gz'
  with gzip.open(log, 'wt') as f:
    f.write(PROFILES)
  r = subprocess.run(
    [sys.executable, os.path.join(ROOT, 'scripts', 'autotune_log.py'), str(log), '--sort=best'],
    capture_output=True,
    text=True,
  )
  assert r.returncode == 0, r.stderr
  assert '2 instructions autotuned, 4 candidates timed (0 failed).' in r.stdout
