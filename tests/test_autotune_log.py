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
