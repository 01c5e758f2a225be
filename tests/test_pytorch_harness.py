"""--framework=pytorch on the CPU with a toy peer (tests/toy_peer.py): the run end to end, the
search through out-of-memory trials, the precision policies, --torch_compile, one-line errors."""

import json
import os
import subprocess
import sys
import time

import jax
import pytest
import torch

from jaxbench import cli
from jaxbench.core import backend, probe, search
from jaxbench.core import bench as core_bench
from jaxbench.pytorch import bench as torch_bench
from jaxbench.pytorch import policy as policy_lib
from jaxbench.pytorch import program as program_lib
from jaxbench.pytorch import usage
from models import precision
from models import registry as jax_registry
from models.pytorch import registry
from tests import toy_peer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU = torch.device('cpu')
NO_LIMIT = backend.MemorySetup(
  gpu_total_bytes=None, limit_bytes=None, mem_fraction=None, remat=False
)
FAST = dict(warmup_steps=1, steps=2, windows=1)


@pytest.fixture
def toy(monkeypatch):
  """The toy as bert_base's peer, in this process's registry."""
  peers = dict(registry._PEERS)  # pylint: disable=protected-access
  toy_peer.install(peers)
  monkeypatch.setattr(registry, '_PEERS', peers)
  return toy_peer.TOY


def site(tmp_path, *lines: str) -> dict[str, str]:
  """An environment whose Python processes run `lines` first (a sitecustomize on the path),
  but for the `python -c` one-liners of other tools (Inductor loads each kernel it builds in one,
  to check it; importing the toy there took 7 s each on two cores). tests/forked.py's parent is
  such a one-liner too, and runs them: it runs jaxbench.main's command lines."""
  guard = "import sys\nif sys.orig_argv[1:2] != ['-c'] or 'runpy' in sys.orig_argv[2]:\n"
  body = ''.join(f'  {line}\n' for line in lines) or '  pass\n'
  (tmp_path / 'sitecustomize.py').write_text(guard + body)
  return {**os.environ, 'PYTHONPATH': f'{tmp_path}{os.pathsep}{ROOT}', 'JAX_PLATFORMS': 'cpu'}


TOY_SITE = ('from tests import toy_peer', 'toy_peer.install()')


def jaxbench(env, *args, timeout=300):
  return subprocess.run(
    [sys.executable, '-m', 'jaxbench.main', *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def one_line_error(r, *says: str) -> None:
  assert r.returncode == 2, (r.returncode, r.stderr)
  lines = r.stderr.splitlines()
  assert len(lines) == 1 and 'Traceback' not in r.stderr, r.stderr
  assert lines[0].startswith('jaxbench: error: '), lines[0]
  for s in says:
    assert s in lines[0], lines[0]
  assert r.stdout == ''


def test_a_pytorch_run_prints_the_table_and_records_framework_and_versions(tmp_path):
  out = tmp_path / 'r.jsonl'
  r = jaxbench(
    site(tmp_path, *TOY_SITE),
    '--model=bert_base',
    '--framework=pytorch',
    '--tiny',
    '--batch_size=4',
    '--steps=2',
    '--windows=1',
    '--warmup_steps=1',
    f'--output={out}',
  )
  assert r.returncode == 0, r.stderr
  header = r.stdout.strip().splitlines()[0]
  assert header.split()[:4] == ['workload', 'precision', 'framework', 'device'], r.stdout
  assert 'PyTorch' in r.stdout and 'bert_base' in r.stdout
  (record,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert record['framework'] == 'pytorch' and record['status'] == 'ok'
  assert record['torch_version'] == torch.__version__
  assert {'cuda_version', 'cudnn_version', 'torch_cuda_version'} <= set(record)
  assert record['max_batch'] == 4 and record['search']['mode'] == 'fixed'
  m = record['measurement']
  assert len(m['window_step_s']) == 1 and m['steps_per_window'] == 2 and m['units_per_s'] > 0
  assert record['peer']['source'] == toy_peer.TOY.source
  assert record['peer']['compiled'] is None  # --torch_compile would compile each loss


def test_the_search_recovers_from_out_of_memory_to_the_known_limit(toy, monkeypatch):
  monkeypatch.setenv(toy_peer.OOM_ENV, '13')
  w = jax_registry.get('bert_base')
  cfg = w.resolve(tiny=True)
  program = program_lib.Program(w, cfg, toy, policy_lib.get('fp32'), CPU)
  found = search.find_max_batch(program, None, max_examples=1000)
  assert found.error is None and found.max_examples == 13
  outcomes = {t.examples: t.outcome for t in found.trials}
  assert outcomes[13] == probe.FITS and outcomes[14] == probe.OOM_RUN
  # Doubling, then bisection: 1, 2, 4, 8, 16 (out of memory), then within the bracket.
  assert [t.examples for t in found.trials][:5] == [1, 2, 4, 8, 16]
  assert all(t.fits == (t.examples <= 13) and t.run_s is not None for t in found.trials), (
    found.trials
  )
  # After each out-of-memory the next trial ran from a fresh state and fitted where it should.
  after_oom = [b for a, b in zip(found.trials, found.trials[1:]) if a.outcome == probe.OOM_RUN]
  assert any(t.fits for t in after_oom)


def test_the_bench_records_every_trial_and_times_the_max(toy, monkeypatch):
  monkeypatch.setenv(toy_peer.OOM_ENV, '6')
  w = jax_registry.get('bert_base')
  result = torch_bench.run(w, core_bench.Options(tiny=True, **FAST), NO_LIMIT, log=lambda _: None)
  assert result['status'] == 'ok' and result['framework'] == 'pytorch'
  assert result['max_batch'] == 6 and result['measurement']['examples'] == 6
  trials = result['search']['trials']
  assert [t['examples'] for t in trials] == [t.examples for t in search_order(6)]
  # The toy's own counts, each module's and the total: Embedding(V, H) and Linear(H, V).
  cfg = w.resolve(tiny=True)
  v, h = cfg['vocab'], cfg['hidden']
  assert result['params'] == {'total': 2 * v * h + v, 'embed': v * h, 'head': h * v + v}


def search_order(limit):
  """The trials find_max_batch makes without a forecast against a hard limit (a fake program)."""

  class Fake:
    workload = jax_registry.get('bert_base')
    cfg = workload.resolve(tiny=True)

    def compile(self, n):
      return program_lib.prog.Compiled(n, None, None, None, None, None)

    def run(self, compiled, steps):
      if compiled.n > limit:
        raise torch.OutOfMemoryError('out of memory')
      return 1.0

  return search.find_max_batch(Fake(), None, max_examples=1000).trials


def test_a_failed_trial_that_leaves_memory_allocated_stops_the_search(toy, monkeypatch):
  monkeypatch.setenv(toy_peer.OOM_ENV, '3')
  w = jax_registry.get('bert_base')
  program = program_lib.Program(w, w.resolve(tiny=True), toy, policy_lib.get('fp32'), CPU)
  in_use = iter(range(0, 1000, 8))  # every read shows more bytes: a leak after each trial
  monkeypatch.setattr(program, 'bytes_in_use', lambda: next(in_use))
  found = search.find_max_batch(program, None, max_examples=1000)
  assert found.trials[-1].outcome == probe.ERROR
  assert 'stayed allocated after the failed trial at 4 examples' in found.error
  assert found.max_examples == 2  # the largest batch that ran in this search


def test_the_cpu_budget_bounds_the_estimated_bytes(toy):
  w = jax_registry.get('bert_base')
  program = program_lib.Program(
    w, w.resolve(tiny=True), toy, policy_lib.get('fp32'), CPU, cpu_budget_bytes=200_000
  )
  found = search.find_max_batch(program, None, max_examples=1 << 12)
  n = found.max_examples
  assert 1 <= n < 1 << 12 and found.error is None
  fits = program.estimated_bytes
  program.run(program.compile(n), 1)
  assert program.estimated_bytes <= 200_000
  with pytest.raises(torch.OutOfMemoryError, match='out of memory'):
    program.run(program.compile(n + 1), 1)
  assert program.estimated_bytes > 200_000 and fits is not None


@pytest.fixture
def switches():
  """The process-wide switches a policy sets, restored after the test."""
  saved = (
    torch.backends.cuda.matmul.allow_tf32,
    torch.backends.cudnn.allow_tf32,
    torch.backends.cudnn.benchmark,
  )
  yield
  torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
  torch.backends.cudnn.benchmark = saved[2]


@pytest.mark.parametrize(
  'name, tf32, dtype, scaled',
  [
    ('fp32', False, None, False),
    ('tf32', True, None, False),
    ('bf16', True, torch.bfloat16, False),
    ('fp16', True, torch.float16, True),
  ],
)
def test_each_precision_sets_tf32_autocast_and_the_scaler(name, tf32, dtype, scaled, switches):
  torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not tf32
  torch.backends.cudnn.benchmark = False
  p = policy_lib.get(name)
  policy_lib.apply(p)
  assert torch.backends.cuda.matmul.allow_tf32 is tf32
  assert torch.backends.cudnn.allow_tf32 is tf32
  assert torch.backends.cudnn.benchmark is True
  with policy_lib.autocast(p, CPU)():
    assert torch.is_autocast_enabled('cpu') is (dtype is not None)
    if dtype is not None:
      assert torch.get_autocast_dtype('cpu') == dtype
      assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == dtype
  scaler = policy_lib.scaler(p, CPU)
  assert (scaler is not None) is scaled
  if scaled:
    assert scaler.get_scale() == 2.0**15


@pytest.mark.parametrize('name', ['transformer_big', 'bert_base'])
def test_the_fp16_scaler_starts_and_grows_as_the_jax_workloads_loss_scale(name):
  """transformer_big's JAX workload scales its loss as fairseq does, the others as the fp16
  policy: the peer's gradient scaler starts at the JAX state's scale and doubles as often."""
  w = jax_registry.get(name)
  state = jax.jit(w.trainer(w.resolve(tiny=True), precision.get('fp16')).init)(jax.random.key(0))
  scaler = policy_lib.scaler(policy_lib.get('fp16'), CPU, registry.get(name).loss_scale)
  assert scaler.get_scale() == float(state.loss_scale.scale)
  assert scaler.get_growth_interval() == state.loss_scale.growth_interval


def test_torch_compile_wraps_each_loss_and_times_the_first_step(toy, monkeypatch):
  compiled = []
  cold_s = 0.3  # the first compile ever; later ones reload Inductor's on-disk caches

  def fake_compile(fn, dynamic=None, backend='inductor'):
    compiled.append(dynamic)
    cold = len(compiled) == 1

    def first_call_compiles(*args, **kwargs):
      nonlocal cold
      if cold:
        time.sleep(cold_s)
        cold = False
      return fn(*args, **kwargs)

    return first_call_compiles

  monkeypatch.setattr(torch, 'compile', fake_compile)
  monkeypatch.setattr(torch._dynamo, 'reset', lambda: None)  # pylint: disable=protected-access
  w = jax_registry.get('bert_base')
  opts = core_bench.Options(tiny=True, batch_size=2, **FAST)
  result = torch_bench.run(w, opts, NO_LIMIT, log=lambda _: None, torch_compile=True)
  assert result['status'] == 'ok' and result['torch_compile'] is True
  assert compiled and all(d is False for d in compiled)  # one static graph per batch
  m = result['measurement']
  # The compile is the first trial's first step, not the timed run's warm-up (a warm cache).
  assert m['compile_s'] >= cold_s > m['first_step_s']
  eager = torch_bench.run(w, opts, NO_LIMIT, log=lambda _: None)
  assert eager['measurement']['compile_s'] is None and eager['torch_compile'] is False


@pytest.mark.slow
def test_torch_compile_runs_for_real(tmp_path):
  out = tmp_path / 'r.jsonl'
  r = jaxbench(
    site(tmp_path, *TOY_SITE),
    '--model=bert_base',
    '--framework=pytorch',
    '--torch_compile',
    '--tiny',
    '--batch_size=2',
    '--steps=2',
    '--windows=1',
    '--warmup_steps=1',
    f'--output={out}',
    timeout=600,
  )
  assert r.returncode == 0, r.stderr
  (record,) = [json.loads(line) for line in out.read_text().splitlines()]
  assert record['torch_compile'] is True and record['measurement']['compile_s'] > 0


def plan(**kw):
  return cli.plan(cli.Args(model=('bert_base',), tiny=True, **kw))


@pytest.mark.parametrize(
  'kw, says',
  [
    (dict(torch_compile=True), '--torch_compile compiles the PyTorch side'),
    (dict(framework='pytorch', frameworks=('jax', 'pytorch')), 'conflict'),
    (dict(framework='pytorch', predict=True), '--predict is for JAX runs'),
    (dict(frameworks=('jax', 'pytorch'), remat=True), '--remat is for JAX runs'),
    (dict(framework='pytorch', profile_dir='x'), '--profile_dir is for JAX runs'),
    (dict(framework='pytorch', run_every_fit=False), '--norun_every_fit is for JAX runs'),
    (dict(framework='pytorch', train_steps=5), '--train_steps is for JAX runs'),
    (dict(framework='pytorch', devices='2'), '--devices, --shard_optimizer and --scaling are for'),
  ],
)
def test_the_plan_refuses_what_a_pytorch_run_cannot_do(kw, says, toy):
  with pytest.raises(cli.UsageError, match=says):
    plan(**kw)


def test_the_plan_accepts_a_pytorch_run_with_a_peer(toy):
  p = plan(framework='pytorch', torch_compile=True)
  assert p.framework == 'pytorch' and p.torch_compile
  assert plan().framework == 'jax'


def test_a_workload_without_a_peer_is_refused_naming_those_with_one(monkeypatch):
  monkeypatch.setattr(registry, '_PEERS', {'bert_base': toy_peer.TOY})
  with pytest.raises(
    cli.UsageError, match='yolov3 has no PyTorch peer; workloads with one: .*bert_base'
  ):
    cli.plan(cli.Args(model=('yolov3',), tiny=True, framework='pytorch'))


def test_without_torch_the_plan_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, 'torch', None)  # `import torch` raises ImportError
  with pytest.raises(cli.UsageError, match=r"pip install -e '\.\[pytorch\]'"):
    plan(framework='pytorch')
  assert usage.torch_missing() is not None


@pytest.mark.parametrize('check', [True, False])
@pytest.mark.parametrize(
  'lines, args, says',
  [
    (('import sys', "sys.modules['torch'] = None"), ['--framework=pytorch'], "'.[pytorch]'"),
    ((), ['--torch_compile'], '--torch_compile'),
    (
      ('from models.pytorch import registry', 'registry._PEERS.clear()'),
      ['--framework=pytorch'],
      'has no PyTorch peer',
    ),
    (TOY_SITE, ['--framework=pytorch', '--predict', '--gpus=v100_16'], '--predict'),
  ],
)
def test_the_command_line_errors_are_one_line_and_status_2(tmp_path, lines, args, says, check):
  r = jaxbench(
    site(tmp_path, *lines), '--model=bert_base', '--tiny', *args, *(['--check'] if check else [])
  )
  one_line_error(r, says)


def test_check_accepts_a_pytorch_run(tmp_path):
  r = jaxbench(
    site(tmp_path, *TOY_SITE),
    '--model=bert_base',
    '--framework=pytorch',
    '--torch_compile',
    '--check',
  )
  assert r.returncode == 0, r.stderr
  assert 'ok' in r.stdout


def test_a_jax_run_never_imports_torch():
  code = (
    'import sys\n'
    'from jaxbench import cli\n'
    'from jaxbench.core import runner\n'
    'from jaxbench.pytorch import frameworks, usage\n'
    "cli.plan(cli.Args(model=('bert_base',), tiny=True))\n"
    "print('torch' in sys.modules)\n"
  )
  r = subprocess.run(
    [sys.executable, '-c', code],
    cwd=ROOT,
    env={**os.environ, 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu'},
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == 'False'
