"""Training with checkpoints from the command line: a run killed at any moment resumes where it
last saved and goes on as if never stopped; SIGTERM saves and exits cleanly; bad input and
another run's checkpoint are one line and status 2."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from jaxbench.train import checkpoint
from tests.test_checkpoint import damage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Tiny BERT at a fixed batch, a loss point at every step: long enough (about a second of steps
# and a dozen saves on a CPU) that a signal sent at step 60 lands well before the end.
STEPS, EVERY, SIGNAL_AT = 400, 25, 60
TRAIN = (
  '--model=bert_base',
  '--tiny',
  '--batch_size=2',
  f'--train_steps={STEPS}',
  '--log_every=1',
  f'--checkpoint_every={EVERY}',
)


def command(*args):
  return [sys.executable, '-m', 'jaxbench.main', *args]


def jaxbench(*args, timeout=300):
  return subprocess.run(
    command(*args), cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True, timeout=timeout
  )


def one_line_error(r, says):
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2, r.stderr
  assert len(lines) == 1 and lines[0].startswith('jaxbench: error: '), r.stderr
  assert says in lines[0], lines[0]


def last_record(path):
  with open(path) as f:
    return json.loads(f.read().splitlines()[-1])


def losses(record):
  curve = record['train']['loss_curve']
  assert [step for step, _ in curve] == list(range(1, STEPS + 1))
  return np.array([loss for _, loss in curve])


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  """One compilation cache for the module's runs: the first compiles, the others load."""
  return f'--compilation_cache_dir={tmp_path_factory.mktemp("compilation_cache")}'


@pytest.fixture(scope='module')
def uninterrupted(cache, tmp_path_factory):
  """The loss at every step of the run trained from start to end without checkpoints."""
  out = tmp_path_factory.mktemp('uninterrupted') / 'result.jsonl'
  r = jaxbench(*TRAIN, cache, f'--output={out}')
  assert r.returncode == 0, r.stderr
  record = last_record(out)
  assert record['status'] == 'ok' and record['train']['resumed_from'] is None
  assert record['train']['step_s']['median'] > 0
  return losses(record)


def stopped_at_step(sig, *args) -> tuple[int, str]:
  """A training run sent `sig` once its log shows step SIGNAL_AT; its status and stderr."""
  p = subprocess.Popen(
    command(*args),
    cwd=ROOT,
    env=os.environ.copy(),
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  seen = []
  for line in p.stderr:
    seen.append(line)
    if f': step {SIGNAL_AT}/' in line:
      p.send_signal(sig)
      break
  seen.append(p.stderr.read())
  p.wait(timeout=120)
  return p.returncode, ''.join(seen)


@pytest.mark.slow
def test_a_run_killed_partway_resumes_at_its_last_save_with_the_uninterrupted_losses(
  uninterrupted, cache, tmp_path
):
  ckpt, out = f'--checkpoint_dir={tmp_path / "ckpt"}', f'--output={tmp_path / "result.jsonl"}'
  status, log = stopped_at_step(signal.SIGKILL, *TRAIN, cache, ckpt)
  assert status == -signal.SIGKILL, log
  # Without --batch_size, the run resumes at the batch of its checkpoints.
  r = jaxbench(*[a for a in TRAIN if a != '--batch_size=2'], cache, ckpt, out)
  assert r.returncode == 0, r.stderr
  record = last_record(tmp_path / 'result.jsonl')
  assert record['batch'] == 2 and record['search'] == {'mode': 'checkpoint'}
  resumed = record['train']['resumed_from']
  # It lost at most the steps since the last save (whose writing may still have been going on).
  assert resumed is not None and resumed % EVERY == 0 and SIGNAL_AT - 2 * EVERY <= resumed < STEPS
  assert f'resumed from the checkpoint of step {resumed}' in r.stderr
  assert record['status'] == 'ok' and record['train']['step'] == STEPS
  np.testing.assert_allclose(losses(record), uninterrupted, rtol=1e-6)


@pytest.mark.slow
def test_sigterm_saves_and_exits_and_a_damaged_newest_save_falls_back_to_the_one_before(
  uninterrupted, cache, tmp_path
):
  ckpt_dir, out = tmp_path / 'ckpt', tmp_path / 'result.jsonl'
  status, log = stopped_at_step(
    signal.SIGTERM, *TRAIN, cache, f'--checkpoint_dir={ckpt_dir}', f'--output={out}'
  )
  assert status == 128 + signal.SIGTERM, log
  assert 'Traceback' not in log and 'SIGTERM: stopped at step' in log, log
  record = last_record(out)
  stopped = record['train']['step']
  assert record['status'] == 'interrupted' and SIGNAL_AT <= stopped < STEPS
  saved = sorted(int(name) for name in os.listdir(ckpt_dir) if name.isdigit())
  assert saved[-1] == stopped == record['train']['saved_steps'][-1]  # saved at the signal
  damage(str(ckpt_dir / str(stopped)))
  r = jaxbench(*TRAIN, cache, f'--checkpoint_dir={ckpt_dir}', f'--output={out}')
  assert r.returncode == 0, r.stderr
  assert f'checkpoint step {stopped} is unreadable' in r.stderr
  record = last_record(out)
  assert record['train']['resumed_from'] == saved[-2]
  np.testing.assert_allclose(losses(record), uninterrupted, rtol=1e-6)


@pytest.mark.parametrize('check', [False, True])
def test_a_checkpoint_of_another_config_is_refused_in_one_line(tmp_path, check):
  # Tiny BERT has two layers: this directory holds a one-layer run's checkpoints.
  from models import registry  # pylint: disable=g-import-not-at-top

  bert = registry.get('bert_base')
  cfg = bert.resolve(tiny=True, overrides={'layers': '1'})
  checkpoint.write_identity(
    str(tmp_path), checkpoint.identity('bert_base', bert.revision, cfg, 'fp32', 2, 0)
  )
  (tmp_path / '25').mkdir()
  r = jaxbench(*TRAIN, f'--checkpoint_dir={tmp_path}', *(['--check'] if check else []))
  one_line_error(r, 'holds checkpoints of another run (config layers=1, not 2)')


@pytest.mark.parametrize(
  'args, says',
  [
    (['--train_steps=0'], 'flag --train_steps=0'),
    (['--train_steps=5', '--checkpoint_every=0'], 'flag --checkpoint_every=0'),
    (['--checkpoint_dir=DIR'], '--checkpoint_dir keeps a training run: give --train_steps'),
    (['--train_steps=5', '--gpus=lambda2020'], 'not with --gpus'),
    (['--train_steps=5', '--gpu=v100', '--predict'], 'not with --predict'),
    (['--train_steps=5', '--model=bert_base,transformer_big'], 'give one --model'),
    (['--train_steps=5', '--devices=2'], 'not with --devices'),
    (['--train_steps=5', '--checkpoint_dir=/proc/jaxbench'], '--checkpoint_dir: cannot create'),
  ],
)
@pytest.mark.parametrize('check', [False, True])
def test_bad_training_input_is_one_line_and_status_2(args, says, check):
  r = jaxbench('--model=bert_base', '--tiny', *args, *(['--check'] if check else []))
  one_line_error(r, says)


def test_check_accepts_a_training_run_and_creates_nothing(tmp_path):
  r = jaxbench(*TRAIN, f'--checkpoint_dir={tmp_path / "new" / "ckpt"}', '--check')
  assert r.returncode == 0, r.stderr
  assert 'ok: the flags are valid for bert_base' in r.stdout
  assert not (tmp_path / 'new').exists()
