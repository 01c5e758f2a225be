"""Data parallelism (jaxbench/core/mesh.py): the sharded step trains as the unsharded one, the
search is per device, bad device counts are one line, and several processes join one mesh.

The tests that need several devices run in a child process whose XLA_FLAGS fake them on the
CPU (--xla_force_host_platform_device_count), so that no other test sees them.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from jaxbench.core import mesh
from jaxbench.results import commands, measured, records
from tests.test_measured import _run, toy  # noqa: F401  (toy: the fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(devices: int) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', 'CUDA_VISIBLE_DEVICES')}
  env.update(
    PYTHONPATH=ROOT,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}',
  )
  return env


def _python(code: str, devices: int, timeout: int = 600) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, '-c', textwrap.dedent(code)],
    env=_env(devices),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def _jaxbench(*args: str, devices: int) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, '-m', 'jaxbench.main', *args],
    env=_env(devices),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )


_SAME_STEP = """
import jax, numpy as np
from jaxbench.core import mesh, program as prog
from models import precision, registry

w = registry.get('bert_base')
cfg, policy = w.resolve(tiny=True), precision.get('fp32')

def one_step(program, n):
  compiled = program.compile(n)
  state, batch = program.materialize(n)
  shardings = [x.sharding for x in jax.tree.leaves(batch)]
  state, metrics = compiled.executable(state, batch, program.rng)
  return compiled, shardings, float(metrics['loss']), jax.tree.map(np.asarray, state)

whole, _, loss, state = one_step(prog.Program(w, cfg, policy), 8)
out = {'loss': loss, 'peak': whole.peak_bytes}
for zero in (False, True):
  layout = mesh.Layout.local(4, shard_optimizer=zero)
  program = prog.Program(w, cfg, policy, layout=layout)
  split, shardings, split_loss, split_state = one_step(program, 2)
  diff = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b), initial=0.0)), state, split_state)
  out[str(zero)] = {
    'loss': split_loss,
    'param_diff': max(jax.tree.leaves(diff.params)),
    'opt_diff': max(jax.tree.leaves(diff.opt_state)),
    'peak': split.peak_bytes,
    'batch_split': all(len(s.device_set) == 4 and not s.is_fully_replicated for s in shardings),
  }
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_step_on_four_devices_trains_as_on_one():
  done = _python('import json\n' + _SAME_STEP, devices=4)
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.splitlines()[-1])
  for zero in ('False', 'True'):  # the state replicated, then ZeRO-1's optimizer state split
    split = out[zero]
    assert split['batch_split']
    assert split['loss'] == pytest.approx(out['loss'], rel=1e-5)
    assert split['param_diff'] < 1e-5 and split['opt_diff'] < 1e-5
    # The forecast is one device's: a quarter of the batch, the same parameters.
    assert split['peak'] < out['peak']
  assert out['True']['peak'] < out['False']['peak']  # each device holds a quarter of Adam's state


def test_the_launcher_decides_whether_processes_join():
  none = mesh.Hosts()
  assert mesh.distributed_args(none, {}) is None  # a plain host: nothing initialized
  flags = mesh.Hosts('h0:1234', 2, 1)
  assert mesh.distributed_args(flags, {'JAX_COORDINATOR_ADDRESS': 'other:1'}) == {
    'coordinator_address': 'h0:1234',
    'num_processes': 2,
    'process_id': 1,
  }
  k8s = {'JAX_COORDINATOR_ADDRESS': 'bench-0.bench:1234', 'JAX_NUM_PROCESSES': '2'}
  assert mesh.distributed_args(none, {**k8s, 'JOB_COMPLETION_INDEX': '1'}) == {
    'coordinator_address': 'bench-0.bench:1234',
    'num_processes': 2,
    'process_id': 1,
  }
  slurm = dict.fromkeys(
    ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_PROCID', 'SLURM_LOCALID'), '0'
  )
  assert mesh.distributed_args(none, {**slurm, 'SLURM_NTASKS': '2'}) == {}  # JAX reads SLURM's
  assert mesh.distributed_args(none, {**slurm, 'SLURM_NTASKS': '1'}) is None
  with pytest.raises(mesh.MeshError, match='process id 2 is not below the process count 2'):
    mesh.distributed_args(mesh.Hosts('h0:1234', 2, 2), {})
  with pytest.raises(mesh.MeshError, match="JAX_NUM_PROCESSES='two'"):
    mesh.distributed_args(none, {**k8s, 'JAX_NUM_PROCESSES': 'two'})


def test_only_the_gpus_in_use_are_visible(monkeypatch):
  seen = {}
  monkeypatch.setattr(mesh.jax.config, 'update', lambda k, v: seen.__setitem__(k, v))
  gpus = {'CUDA_VISIBLE_DEVICES': '4,5,6'}
  mesh.start('2', mesh.Hosts(), gpus)
  assert seen == {'jax_cuda_visible_devices': '0,1'}  # the first two of those CUDA shows
  seen.clear()
  mesh.start('3', mesh.Hosts(), gpus)
  mesh.start('all', mesh.Hosts(), gpus)
  assert seen == {}  # all of them: nothing hidden
  with pytest.raises(mesh.MeshError, match='--devices=4: this host has 3 GPUs'):
    mesh.start('4', mesh.Hosts(), gpus)


@pytest.mark.usefixtures('toy')
def test_the_tables_and_the_command_show_devices_and_scaling():
  fixed = {'mode': 'fixed', 'trials': []}
  scaling = {'source': 'same process', 'units_per_s_1': 20.0, 'efficiency': 0.846, 'error': None}
  par = {'local_devices': 4, 'global_devices': 4, 'global_batch': 656, 'scaling': scaling}
  one, four = _run(search=fixed), _run(search=fixed, parallel={**par, 'processes': 1})
  assert records.devices(one) == '1' and records.devices(four) == '4 (85% scaling)'
  table = measured.table([one, four])
  rows = table.rows  # one device and four are two rows
  assert measured.PARALLEL_NOTE in table.notes and measured.PARALLEL_NOTE not in measured.NOTES
  assert [r[3:5] for r in rows] == [
    ['fixed 164 images', '67.7 images/s'],
    ['fixed 164 images per device × 4 devices', '67.7 images/s (85% scaling)'],
  ]
  assert '--batch_size=164' in commands.command_of(one) and '--devices' not in rows[0][10]
  assert '--devices=4 --scaling --batch_size=656' in commands.command_of(four)


def test_bad_device_counts_are_one_line_and_status_2():
  for args, line in (
    (['--devices=0'], 'flag --devices=0: must be "all" or a whole number of devices, at least 1'),
    (['--devices=3'], '--devices=3: this process has 2 CPU devices'),
    (
      ['--devices=2', '--gpu=t4'],
      "--devices runs on this host's devices: not with a card to emulate or predict",
    ),
    (
      ['--devices=all', '--batch_size=3'],
      '--batch_size=3 of bert_base: 3 examples do not split evenly over 2 devices: give a '
      'multiple of 2 examples',
    ),
  ):
    done = _jaxbench('--model=bert_base', '--check', *args, devices=2)
    assert (done.returncode, done.stderr) == (2, f'jaxbench: error: {line}\n')


_JOIN = """
import json, sys
import jax, numpy as np
from jaxbench.core import mesh

mesh.start('2', mesh.Hosts(f'localhost:{sys.argv[1]}', 2, int(sys.argv[2])))
layout = mesh.Layout.local(2)
# Each device's row holds its global index; the sum over the mesh is an all-reduce across both.
rows = jax.make_array_from_callback(
  (4,), layout.sharding(mesh.AXIS), lambda i: np.arange(4, dtype=np.float32)[i]
)
total = jax.jit(jax.numpy.sum, out_shardings=layout.sharding())(rows)
print(json.dumps({**layout.topology(), 'total': float(total.addressable_data(0))}))
"""


def test_two_processes_join_one_mesh():
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = s.getsockname()[1]
  code = [sys.executable, '-c', _JOIN, str(port)]
  procs = [
    subprocess.Popen(
      [*code, str(i)],
      env=_env(2),
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in (0, 1)
  ]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  got = [json.loads(out.splitlines()[-1]) for out, _ in outs]
  for i, topology in enumerate(got):
    assert topology == {
      'processes': 2,
      'process_id': i,
      'local_devices': 2,
      'global_devices': 4,
      'device_kind': 'cpu',
      'shard_optimizer': False,
      'total': 6.0,
    }


@pytest.mark.slow
def test_the_search_is_per_device(tmp_path):
  out = tmp_path / 'r.jsonl'
  budget = 750_000  # two examples of tiny BERT per device (0.68 MB), three compiles
  done = _jaxbench(
    '--model=bert_base',
    '--devices=2',
    f'--memory_limit_gb={budget / 1e9}',
    '--norun_every_fit',
    '--warmup_steps=0',
    '--steps=1',
    '--windows=1',
    f'--output={out}',
    devices=2,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  r = json.loads(out.read_text())
  assert r['status'] == 'ok' and r['parallel']['global_devices'] == 2
  trials = {t['examples']: t for t in r['search']['trials']}
  best = r['max_examples']
  # The boundary is one device's forecast against the cap: n fits, n + 1 does not.
  assert trials[best]['outcome'] == 'fits' and trials[best]['predicted_peak_bytes'] <= budget
  assert trials[best + 1]['outcome'] == 'oom_predicted'
  assert trials[best + 1]['predicted_peak_bytes'] > budget
  assert r['max_batch'] == best and r['parallel']['global_batch'] == 2 * best
  assert r['measurement']['units_per_s'] == pytest.approx(
    2 * best / r['measurement']['median_step_s']
  )
