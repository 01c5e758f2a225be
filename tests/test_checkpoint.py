"""The checkpoints of a training run: asynchronous saves, the last K kept, a damaged or
unfinished step passed over for the last good one, and the run's identity beside them."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from jaxbench import cli
from jaxbench.train import checkpoint


def tree(step: int) -> dict:
  return {'w': jnp.full((4, 3), float(step)), 'opt': {'mu': jnp.arange(5) * step}, 'none': None}


def saved(directory, steps, keep=3, log=print) -> checkpoint.Checkpoints:
  ckpts = checkpoint.Checkpoints(str(directory), keep, log)
  for step in steps:
    ckpts.save(step, tree(step), {'step': step, 'loss_curve': [[step, 1.0 / step]]})
  ckpts.wait()
  return ckpts


def test_the_newest_step_restores_whole_and_only_the_last_k_are_kept(tmp_path):
  ckpts = saved(tmp_path, [2, 4, 6, 8], keep=3)
  assert ckpts.steps() == [4, 6, 8]
  step, arrays, record = ckpts.restore_latest(tree(0))
  ckpts.close()
  assert step == 8 and record['loss_curve'] == [[8, 1.0 / 8]]
  np.testing.assert_array_equal(arrays['w'], np.full((4, 3), 8.0))
  np.testing.assert_array_equal(arrays['opt']['mu'], np.arange(5) * 8)


def damage(step_dir: str) -> None:
  """What a drive that lost the end of a write leaves: every file of the step truncated."""
  for root, _, files in os.walk(step_dir):
    for name in files:
      with open(os.path.join(root, name), 'r+b') as f:
        f.truncate(0)


def test_a_damaged_newest_step_is_set_aside_and_the_one_before_it_restored(tmp_path):
  logged = []
  saved(tmp_path, [2, 4, 6]).close()
  damage(str(tmp_path / '6'))
  ckpts = checkpoint.Checkpoints(str(tmp_path), 3, logged.append)
  step, arrays, _ = ckpts.restore_latest(tree(0))
  assert step == 4
  np.testing.assert_array_equal(arrays['w'], np.full((4, 3), 4.0))
  assert len(logged) == 1 and 'checkpoint step 6 is unreadable' in logged[0], logged
  assert (tmp_path / '6.unreadable').is_dir() and not (tmp_path / '6').exists()
  # The run goes on from step 4 and saves step 6 again.
  ckpts.save(6, tree(6), {'step': 6, 'loss_curve': []})
  ckpts.wait()
  assert ckpts.restore_latest(tree(0))[0] == 6
  ckpts.close()


def test_what_a_kill_mid_save_leaves_is_no_step(tmp_path):
  saved(tmp_path, [2, 4]).close()
  # Orbax writes a step into a temporary directory and renames it when the save is whole.
  unfinished = tmp_path / '6.orbax-checkpoint-tmp-1234567890'
  (unfinished / 'arrays').mkdir(parents=True)
  (unfinished / 'arrays' / '_METADATA').write_text('{"tree_meta')
  ckpts = checkpoint.Checkpoints(str(tmp_path), 3)
  assert ckpts.steps() == [2, 4]
  assert ckpts.restore_latest(tree(0))[0] == 4
  ckpts.close()


def test_no_step_restores_none(tmp_path):
  ckpts = checkpoint.Checkpoints(str(tmp_path / 'new'), 3)
  assert ckpts.restore_latest(tree(0)) is None
  ckpts.close()


BERT = checkpoint.identity('bert_base', 1, {'layers': 2, 'blocks': (3, 4)}, 'fp32', 8, 0)


@pytest.mark.parametrize(
  'change, says',
  [
    ({'workload': 'transformer_big'}, 'workload bert_base, not transformer_big'),
    ({'precision': 'amp_fp16'}, 'precision fp32, not amp_fp16'),
    ({'batch': 16}, 'batch 8, not 16'),
    ({'seed': 1}, 'seed 0, not 1'),
    ({'config': {'layers': 1, 'blocks': [3, 4]}}, 'config layers=2, not 1'),
  ],
)
def test_a_checkpoint_of_another_run_is_refused_naming_the_difference(tmp_path, change, says):
  line = checkpoint.refusal(str(tmp_path), BERT, {**BERT, **change})
  assert line is not None and says in line and '\n' not in line, line


def test_the_same_run_resumes_and_a_batch_not_yet_searched_agrees_with_any():
  assert checkpoint.refusal('d', BERT, dict(BERT)) is None
  assert checkpoint.refusal('d', BERT, {**BERT, 'batch': None}) is None


def test_the_identity_round_trips_through_its_file(tmp_path):
  checkpoint.write_identity(str(tmp_path), BERT)
  assert checkpoint.read_identity(str(tmp_path)) == BERT
  assert json.loads((tmp_path / checkpoint.IDENTITY_FILE).read_text())['config']['blocks'] == [3, 4]
  (tmp_path / checkpoint.IDENTITY_FILE).write_text('{"schema": "something else"}')
  with pytest.raises(checkpoint.CheckpointError, match='not the identity'):
    checkpoint.read_identity(str(tmp_path))


def test_a_directory_that_cannot_hold_checkpoints_says_why(tmp_path):
  unusable = lambda d: checkpoint.unusable(str(d), cli.unwritable_dir)
  assert unusable(tmp_path / 'a' / 'b') is None and not (tmp_path / 'a').exists()
  (tmp_path / 'file').write_text('x')
  assert 'is not a directory' in unusable(tmp_path / 'file')
  assert 'is not a directory' in unusable(tmp_path / 'file' / 'sub')
  assert 'holds no jaxbench checkpoint' in unusable(tmp_path)
  assert 'cannot create a file' in unusable('/proc/jaxbench_checkpoints')
  assert os.listdir(tmp_path) == ['file']  # nothing left behind
