"""scripts/gpu_queue.py at the deadline: stacks, SIGINT, and after the grace stacks and SIGKILL."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

_PATH = os.path.join(os.path.dirname(__file__), '..', 'scripts', 'gpu_queue.py')
_spec = importlib.util.spec_from_file_location('gpu_queue', _PATH)
gpu_queue = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_queue)

# A job that logs each signal with the time it came; 'exits' ends at SIGINT, 'stuck' does not.
_JOB = """
import signal, sys, time
def on(sig, frame):
  print(signal.Signals(sig).name, time.monotonic(), flush=True)
  if sig == signal.SIGINT and sys.argv[1] == 'exits':
    sys.exit(130)
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGINT, on)
print('ready', flush=True)
while True:
  time.sleep(0.01)
"""


def _stop(behaviour):
  proc = subprocess.Popen(
    [sys.executable, '-c', _JOB, behaviour], stdout=subprocess.PIPE, text=True
  )
  try:
    assert proc.stdout.readline() == 'ready\n'
    rc, killed = gpu_queue.stop(proc, grace_s=1.0, dump_s=0.3)
    got = [line.split() for line in proc.stdout.read().splitlines()]
  finally:
    proc.kill()
    proc.wait()
  return rc, killed, [name for name, _ in got], [float(t) for _, t in got]


@pytest.mark.skipif(not hasattr(signal, 'SIGUSR1'), reason='no SIGUSR1')
def test_a_job_that_exits_at_sigint_gets_its_stack_dump_first():
  rc, killed, names, times = _stop('exits')
  assert (rc, killed) == (130, False)
  assert names == ['SIGUSR1', 'SIGINT']
  assert times[1] - times[0] >= 0.25  # the dump is not raced by the interrupt


@pytest.mark.skipif(not hasattr(signal, 'SIGUSR1'), reason='no SIGUSR1')
def test_a_stuck_job_gets_a_second_stack_dump_before_the_kill():
  rc, killed, names, times = _stop('stuck')
  assert (rc, killed) == (-signal.SIGKILL, True)
  assert names == ['SIGUSR1', 'SIGINT', 'SIGUSR1']
  assert times[2] - times[1] >= 0.9  # the grace period


def test_recover_appends_a_killed_jobs_progress_as_one_whole_line(tmp_path):
  results, progress = tmp_path / 'results.jsonl', tmp_path / 'job00.progress.json'
  results.write_text('{"earlier": 1}\n')
  record = {'status': 'interrupted', 'error': 'ended without its result, while timing at 8 images'}
  record['search'] = {'trials': [{'examples': 8, 'outcome': 'fits'}]}
  progress.write_text(json.dumps(record) + '\n')
  assert gpu_queue.recover(str(progress), str(results), 'killed at the deadline')
  lines = results.read_text().splitlines()
  assert len(lines) == 2 and json.loads(lines[0]) == {'earlier': 1}
  kept = json.loads(lines[1])
  assert (
    kept['error'] == 'killed at the deadline; ended without its result, while timing at 8 images'
  )
  assert kept['search'] == record['search'] and kept['status'] == 'interrupted'
  assert not progress.exists()
  # No progress file (the job wrote its result and removed it): nothing appended.
  assert not gpu_queue.recover(str(progress), str(results), 'killed at the deadline')
  assert len(results.read_text().splitlines()) == 2


def test_every_job_gets_a_progress_file_and_the_queues_results_as_hints(tmp_path):
  """A run keeps its result so far there, a --predict the card it is searching: a job killed in
  a long compile at the deadline still leaves its trials."""
  out, progress = str(tmp_path), str(tmp_path / 'job00.progress.json')
  (tmp_path / 'results.jsonl').write_text('')
  run = gpu_queue.command(['--model=bert_base', '--search_hints=a.jsonl'], out, progress)
  assert f'--progress_file={progress}' in run
  assert f'--search_hints=a.jsonl,{out}/results.jsonl' in run
  predict = gpu_queue.command(['--model=bert_base', '--predict', '--gpus=t4'], out, progress)
  assert f'--progress_file={progress}' in predict
  assert f'--output={out}/results.jsonl' in predict


def test_slots_share_a_gpu_among_predict_jobs_each_capped_without_preallocation(
  tmp_path, monkeypatch
):
  monkeypatch.delenv('XLA_PYTHON_CLIENT_ALLOCATOR', raising=False)
  jobs = tmp_path / 'jobs.txt'
  jobs.write_text('--model=bert_base --predict --gpus=t4\n--model=yolov3 --predict --gpus=t4\n')
  started = []

  class Job:
    def __init__(self, cmd, env, **kwargs):
      started.append((cmd, env))

    def wait(self, timeout=None):
      return 0

  monkeypatch.setattr(gpu_queue.subprocess, 'Popen', Job)
  monkeypatch.setattr(gpu_queue.shutil, 'which', lambda name: None)  # no GPU monitor
  gpu_queue.main(['gpu_queue.py', str(jobs), str(tmp_path / 'q'), '600', '1', '2'])
  models = sorted(a for cmd, _ in started for a in cmd if a.startswith('--model='))
  assert models == ['--model=bert_base', '--model=yolov3']
  assert all(env['CUDA_VISIBLE_DEVICES'] == '0' for _, env in started)
  assert all(env['XLA_PYTHON_CLIENT_PREALLOCATE'] == 'false' for _, env in started)
  assert all(env['XLA_PYTHON_CLIENT_MEM_FRACTION'] == '0.4750' for _, env in started)
  assert all('XLA_PYTHON_CLIENT_ALLOCATOR' not in env for _, env in started)


def test_slots_refuse_a_job_that_runs_a_step(tmp_path):
  jobs = tmp_path / 'jobs.txt'
  jobs.write_text('--model=bert_base --predict --gpus=t4\n--model=yolov3 --batch_size=8\n')
  with pytest.raises(SystemExit, match='for --predict jobs only'):
    gpu_queue.main(['gpu_queue.py', str(jobs), str(tmp_path / 'q'), '600', '1', '2'])


def _fake_jobs(monkeypatch, wait):
  """Jobs that never start a process: `wait(job, timeout)` plays each one's Popen.wait (job has
  .model, .args and .started); the queue's stop only records the job's model. Returns the list
  of models stopped, as they are."""
  stopped = []

  class Job:
    def __init__(self, cmd, env, **kwargs):
      self.model = next(a for a in cmd if a.startswith('--model='))
      self.args, self.started = cmd, time.monotonic()

    def wait(self, timeout=None):
      return wait(self, timeout)

  def stop(proc, *args):
    stopped.append(proc.model)
    return 130, False

  monkeypatch.setattr(gpu_queue.subprocess, 'Popen', Job)
  monkeypatch.setattr(gpu_queue, 'stop', stop)
  monkeypatch.setattr(gpu_queue.shutil, 'which', lambda name: None)  # no GPU monitor
  return stopped


def test_fillers_stop_once_every_other_job_has_ended(tmp_path, monkeypatch):
  """A [filler] job runs beside the main jobs and is stopped when the last of them ends; a
  filler not yet started by then is not started."""
  jobs = tmp_path / 'jobs.txt'
  jobs.write_text(
    '--model=bert_base --predict --gpus=t4\n'
    '[filler] --model=yolov3 --predict --gpus=t4\n'
    '[filler] --model=stylegan --predict --gpus=t4\n'
  )

  def wait(job, timeout):
    end = job.started + (0.3 if 'bert' in job.model else 60)
    if time.monotonic() + (timeout or 0) < end:
      time.sleep(timeout or 0)
      raise gpu_queue.subprocess.TimeoutExpired(job.args, timeout)
    time.sleep(max(0.0, end - time.monotonic()))
    return 0

  stopped = _fake_jobs(monkeypatch, wait)
  start = time.monotonic()
  gpu_queue.main(['gpu_queue.py', str(jobs), str(tmp_path / 'q'), '600', '1', '2'])
  assert time.monotonic() - start < 10
  assert stopped == ['--model=yolov3']
  summary = (tmp_path / 'q' / 'summary.txt').read_text().splitlines()
  assert summary[0].startswith('00 gpu0 rc=0')
  assert summary[1].startswith('01 gpu0 filler rc=130 (cut as the other jobs had ended)')
  assert 'not started (the other jobs had ended)' in summary[2]


def test_job_tags_are_read_in_either_order_and_an_unknown_one_is_refused():
  assert gpu_queue.parse('--model=yolov3') == ('--model=yolov3', False, None)
  assert gpu_queue.parse('[limit=600] [filler] --model=yolov3') == ('--model=yolov3', True, 600.0)
  assert gpu_queue.parse(' [filler][limit=90.5]--model=x ') == ('--model=x', True, 90.5)
  for bad in ('[limit=soon] --model=x', '[later] --model=x', '[limit=] --model=x'):
    with pytest.raises(ValueError, match='unknown job tag'):
      gpu_queue.parse(bad)


def test_a_job_over_its_limit_is_cut_and_the_queue_goes_on(tmp_path, monkeypatch):
  jobs = tmp_path / 'jobs.txt'
  jobs.write_text('[limit=0.5] --model=stylegan --batch_size=8\n--model=yolov3 --batch_size=8\n')
  waited = []

  def wait(job, timeout):
    waited.append((job.model, timeout))
    if 'stylegan' in job.model:  # runs for ever
      raise gpu_queue.subprocess.TimeoutExpired(job.args, timeout)
    return 0

  stopped = _fake_jobs(monkeypatch, wait)
  gpu_queue.main(['gpu_queue.py', str(jobs), str(tmp_path / 'q'), '600'])
  assert waited[0] == ('--model=stylegan', 0.5) and waited[1][0] == '--model=yolov3'
  assert waited[1][1] > 500  # the rest of the queue's time, not the limit
  assert stopped == ['--model=stylegan']
  summary = (tmp_path / 'q' / 'summary.txt').read_text().splitlines()
  assert summary[0].startswith('00 gpu0 rc=130 (cut at its limit of 0.5 s)')
  assert summary[1].startswith('01 gpu0 rc=0')


def test_a_job_file_with_an_unknown_tag_is_refused_before_anything_runs(tmp_path):
  jobs = tmp_path / 'jobs.txt'
  jobs.write_text('--model=yolov3 --batch_size=8\n[soon] --model=yolov3 --batch_size=8\n')
  with pytest.raises(SystemExit, match=r'unknown job tag \[soon\]'):
    gpu_queue.main(['gpu_queue.py', str(jobs), str(tmp_path / 'q'), '600'])
