"""scripts/autotune_progress.py: a cut compile's autotuner lines say where the time went."""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(__file__), '..', 'scripts', 'autotune_progress.py')
_spec = importlib.util.spec_from_file_location('autotune_progress', _PATH)
autotune_progress = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(autotune_progress)

_HLO = '(bf16[166,1024,1024,16]{3,2,1,0}, u8[0]{0}) custom-call(...)'
_LOG = '\n'.join(
  [
    '# gpu0: python3 -m jaxbench.main --model=stylegan',
    'stylegan: batch 166 images: compiling',
    'I1201 13:11:10.100000     557 config_assigner.cc:140] Finding configs for 2 unique '
    'instructions.',
    f'I1201 13:11:10.200000     557 config_assigner.cc:212] Getting config for HLO: %cc.1 = {_HLO}',
    f'I1201 13:11:10.300000     557 config_assigner.cc:212] Getting config for HLO: %cc.2 = {_HLO}',
    'W1201 13:11:17.653634     557 cuda_timer.cc:88] Delay kernel timed out: measured time has '
    'sub-optimal accuracy.',
    'I1201 13:12:20.300000     601 autotuner.cc:330] Picked best config: CUDNN : algo_id: 7',
    'I1201 13:14:00.800000     601 autotuner.cc:330] Picked best config: CUDNN : algo_id: 3',
    'not a log line',
  ]
)


def test_lines_are_counted_by_kind_and_the_longest_silence_comes_first(tmp_path):
  log = tmp_path / 'job.log'
  log.write_text(_LOG)
  with open(log) as f:
    events = autotune_progress.read(f, ('autotuner', 'config_assigner'))
  assert len(events) == 5  # the cuda_timer warning and the job's own lines are not the autotuner's
  text = autotune_progress.summary(events, top=2)
  assert text.startswith('5 autotuner lines from 13:11:10 to 13:14:00 (171 s)')
  assert '| 2 | Getting config for HLO |' in text and '| 2 | Picked best config |' in text
  silences = [line for line in text.splitlines() if line.startswith('- ')]
  assert silences[0].startswith('- 100.5 s after 13:12:20 autotuner.cc: Picked best config')
  assert silences[1].startswith('- 70.0 s after 13:11:10 config_assigner.cc: Getting config')


def test_a_log_without_autotuner_lines_says_what_to_check(tmp_path):
  assert 'TF_CPP_VMODULE' in autotune_progress.summary([])
