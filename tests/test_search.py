"""The max-batch search: doubling, the line jump, bisection, the boundary, OOM handling."""

import copy
import dataclasses
import gc
import json
import re
import signal
import threading
import time

import jax
import pytest

from jaxbench.core import aim, backend, bench, hints, probe, probing, search, search_log, timing
from jaxbench.core import program as prog
from models import precision, registry, transformer
from models import workload as wl

# FakeProgram holds no arrays (tests/conftest.py; the tests marked `releases` keep the collection).
pytestmark = pytest.mark.usefixtures('no_collection_after_a_failed_trial')


class FakeProgram:
  """A program whose memory is peak = a + b*n (+ a bump past `kink`), no XLA involved.

  `true_limit` is where running really fails (the device); the search only
  sees the budget it is given and the predicted peaks.
  """

  def __init__(
    self,
    a=100,
    b=10,
    kink=None,
    bump=0,
    run_fails_above=None,
    compile_fails_above=None,
    error_at=None,
    example_size=1,
    batch_multiple=1,
  ):
    self.a, self.b, self.kink, self.bump = a, b, kink, bump
    self.run_fails_above = run_fails_above
    self.compile_fails_above = compile_fails_above
    self.error_at = error_at
    self.workload = wl.Workload(
      name='fake',
      description='',
      unit='tokens',
      throughput_unit='tokens/s',
      config={},
      tiny={},
      trainer=None,
      flops_per_example=lambda cfg: 1.0,
      example_size=lambda cfg: example_size,
      batch_multiple=batch_multiple,
    )
    self.cfg = {}
    self.compiled, self.ran = [], []

  def peak(self, n):
    return self.a + self.b * n + (self.bump if self.kink is not None and n > self.kink else 0)

  def compile(self, n):
    self.compiled.append(n)
    if self.error_at == n:
      raise ValueError('shape mismatch in dot_general')
    if self.compile_fails_above is not None and n > self.compile_fails_above:
      raise RuntimeError('RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.0GiB.')
    return prog.Compiled(
      n=n,
      executable=None,
      compile_s=0.0,
      peak_bytes=self.peak(n),
      temp_bytes=self.peak(n) - self.a,
      argument_bytes=self.a,
    )

  def run(self, compiled, steps):
    self.ran.append(compiled.n)
    if self.run_fails_above is not None and compiled.n > self.run_fails_above:
      raise RuntimeError('INTERNAL: Failed to autotune: CUDNN_STATUS_ALLOC_FAILED')
    return 1.0


def test_line_jump_finds_exact_boundary_in_few_compiles():
  p = FakeProgram(a=1000, b=7)
  budget = 1000 + 7 * 12345 + 3  # 12345 fits, 12346 does not
  r = search.find_max_batch(p, budget)
  assert r.max_examples == 12345
  assert r.error is None and r.best.n == 12345
  # 1, 2, the predicted boundary and its failing neighbour.
  assert len(r.trials) <= 5, [t.examples for t in r.trials]
  assert {t.outcome for t in r.trials if t.examples == 12346} == {probe.OOM_PREDICTED}
  assert 12346 not in p.ran  # predicted out of memory: not run


def test_bisection_when_the_line_is_wrong():
  # A jump in memory past n=300 (XLA switched algorithms) defeats the line.
  p = FakeProgram(a=0, b=10, kink=300, bump=2000)
  budget = 10 * 500
  r = search.find_max_batch(p, budget)
  expected = max(n for n in range(1, 1000) if p.peak(n) <= budget)
  assert r.max_examples == expected == 300
  assert len(r.trials) <= 24  # about two bisections' worth


def test_a_runtime_boundary_just_below_the_forecast_costs_few_probes():
  # The device fails a little before the forecast says (fragmentation, workspaces).
  p = FakeProgram(a=0, b=1, run_fails_above=990)
  r = search.find_max_batch(p, budget_bytes=1000)
  assert r.max_examples == 990
  assert len(r.trials) <= 12, [t.examples for t in r.trials]


def test_a_tolerance_stops_the_search_early_with_a_true_fit():
  # Without a budget the search doubles then bisects: 8 probes past 512 to pin 700 exactly.
  exact = search.find_max_batch(FakeProgram(run_fails_above=700), budget_bytes=None)
  loose = search.find_max_batch(FakeProgram(run_fails_above=700), budget_bytes=None, tolerance=0.02)
  assert exact.max_examples == 700
  fails = min(t.examples for t in loose.trials if not t.fits)
  assert loose.max_examples <= 700 < fails <= loose.max_examples * 1.02 + 1
  assert loose.best.n == loose.max_examples  # the reported max is one that ran
  assert len(loose.trials) < len(exact.trials)


def _trial(n, peak, fits):
  return probe.Trial(n, n, probe.FITS if fits else probe.OOM_PREDICTED, predicted_peak_bytes=peak)


def test_a_tolerance_sends_a_probe_the_line_puts_beside_a_fit_to_where_its_failure_ends_it():
  # transformer_big fp16 on an 80 GB card (2026-12-06), in sentence pairs: 3803 fitted 8 MB under
  # the budget, 3971 was over it. The line puts the boundary at 3803, and an exact search creeps
  # up from there (3804 fitted, 3814 did not: two more compiles). Within 0.5%, one probe at
  # 3803 + 19 settles it if it fails, as the line says it will.
  budget = 80_767_614_976
  trials = [_trial(1, 3_077_912_732, True), _trial(139, 5_778_343_236, True)]
  trials += [_trial(3971, 84_188_048_756, False), _trial(3803, 80_756_432_180, True)]
  exact = aim.next_probe(trials, budget, 3803, 3971, 1 << 20, 1, False)
  loose = aim.next_probe(trials, budget, 3803, 3971, 1 << 20, 1, False, tolerance=0.005)
  assert exact == (3804, 'up')
  assert loose == (3822, 'up') and aim.closed(3803, 3822, 0.005)
  assert not aim.closed(3803, 3823, 0.005)


def test_a_tolerance_sends_a_probe_the_line_puts_beside_a_failure_to_where_its_fit_ends_it():
  # Peak 10 a unit: 1000 fits at 10,000, 1100 fails; the line says 1099 fits. Within 1% a fit
  # at 1090 ends the search (1100 - 1090 <= 10), so the probe goes there, not to 1099.
  trials = [_trial(1000, 10_000, True), _trial(1100, 11_000, False)]
  assert aim.next_probe(trials, 10_999, 1000, 1100, 1 << 20, 1, False) == (1099, None)
  n, _ = aim.next_probe(trials, 10_999, 1000, 1100, 1 << 20, 1, False, tolerance=0.01)
  assert n == 1090 and aim.closed(n, 1100, 0.01) and not aim.closed(n - 1, 1100, 0.01)


def test_a_tolerance_probes_where_either_outcome_ends_the_search():
  # 1000 fits, 1030 fails, within 2%: a probe at 1010 to 1020 ends it whatever happens; the
  # line's 1025 moves into that range.
  trials = [_trial(1000, 10_000, True), _trial(1030, 10_300, False)]
  n, _ = aim.next_probe(trials, 10_250, 1000, 1030, 1 << 20, 1, False, tolerance=0.02)
  assert n == 1020 and aim.closed(1000, n, 0.02) and aim.closed(n, 1030, 0.02)


def test_a_tolerance_search_on_a_line_takes_fewer_compiles_and_stays_within_it():
  for a, b, boundary in ((3 * 10**9, 20_000_000, 3803), (10**9, 7, 123_457), (500, 3, 900)):
    budget = a + b * boundary + b // 2
    exact = search.find_max_batch(FakeProgram(a=a, b=b), budget)
    loose = search.find_max_batch(FakeProgram(a=a, b=b), budget, tolerance=0.005)
    assert exact.max_examples == boundary
    assert boundary - int(0.005 * boundary) - 1 <= loose.max_examples <= boundary
    assert len(loose.trials) <= len(exact.trials)


@pytest.mark.parametrize('tolerance', [0.0, 0.005])
@pytest.mark.parametrize('boundary', [5, 12, 3803, 3807, 123_457])
def test_a_workload_that_runs_multiples_of_8_is_searched_in_them(boundary, tolerance):
  # fairseq cuts a batch of sentences to a multiple of 8 (--required-batch-size-multiple); the
  # search probes only what the workload runs: any batch below 8, else a multiple of 8.
  a, b = 3 * 10**9, 20_000_000
  p = FakeProgram(a=a, b=b, batch_multiple=8)
  r = search.find_max_batch(p, a + b * boundary + b // 2, tolerance=tolerance)
  assert all(n < 8 or n % 8 == 0 for n in p.compiled), p.compiled
  best = boundary if boundary < 8 else boundary - boundary % 8
  assert best - max(8, int(tolerance * best)) <= r.max_examples <= best and r.error is None
  if tolerance == 0:
    assert r.max_examples == best
  assert r.best.n == r.max_examples


def test_snap_keeps_a_probe_inside_the_bracket_on_a_batch_the_workload_runs():
  assert aim.snap(3803, 3000, 4000, 8) == 3800 and aim.snap(3805, 3000, 4000, 8) == 3808
  assert aim.snap(3803, 3800, 4000, 8) == 3808  # the multiple below is the fit itself
  assert aim.snap(3, 0, 100, 8) == 3  # below the multiple, any batch
  assert aim.snap(3803, 3800, 3808, 8) is None  # nothing between two neighbours
  assert aim.closed(3800, 3808, 0.0, 8) and not aim.closed(3800, 3816, 0.0, 8)
  assert aim.closed(7, 8, 0.0, 8) and not aim.closed(6, 8, 0.0, 8)
  assert aim.snap(41, 40, None, 1) == 41 and aim.snap(41, 40, None, 8) == 48


def _peaks(result):
  return {t.examples: t.predicted_peak_bytes for t in result.trials if t.predicted_peak_bytes}


def test_hints_from_another_budget_aim_the_search_and_keep_its_answer():
  # A search under a small cap, then one at full memory aimed by the first one's forecasts.
  small = search.find_max_batch(FakeProgram(a=1000, b=7), 1000 + 7 * 187 + 3)
  budget = 1000 + 7 * 1176 + 3
  cold = search.find_max_batch(FakeProgram(a=1000, b=7), budget)
  aimed = search.find_max_batch(FakeProgram(a=1000, b=7), budget, hints=_peaks(small))
  assert small.max_examples == 187 and cold.max_examples == aimed.max_examples == 1176
  assert [t.examples for t in aimed.trials] == [1176, 1177]  # straight to the boundary
  assert len(cold.trials) > 2


def test_wrong_hints_cost_probes_never_the_answer():
  p = FakeProgram(a=0, b=10, kink=300, bump=2000)
  budget = 10 * 500
  lying = {1: 0, 2: 1, 900: 2}  # a program that would barely grow with the batch
  r = search.find_max_batch(p, budget, hints=lying)
  assert r.max_examples == 300 and r.best.n == 300
  # Every reported outcome comes from this search's own compiles.
  assert all(t.examples in p.compiled for t in r.trials)


def test_doubling_without_a_budget_relies_on_real_runs():
  p = FakeProgram(run_fails_above=37)
  r = search.find_max_batch(p, budget_bytes=None)
  assert r.max_examples == 37
  ns = [t.examples for t in r.trials]
  assert ns[:7] == [1, 2, 4, 8, 16, 32, 64]  # doubling until the first failure
  assert {t.outcome for t in r.trials if t.examples > 37} == {probe.OOM_RUN}


def test_runtime_oom_below_predicted_budget_counts():
  # The forecast says it fits, the device disagrees (e.g. fragmentation): the device wins.
  p = FakeProgram(a=0, b=1, run_fails_above=50)
  r = search.find_max_batch(p, budget_bytes=1000)
  assert r.max_examples == 50


def test_compile_time_oom_is_out_of_memory_not_error():
  p = FakeProgram(a=0, b=1, compile_fails_above=20)
  r = search.find_max_batch(p, budget_bytes=None)
  assert r.max_examples == 20 and r.error is None
  assert probe.OOM_COMPILE in {t.outcome for t in r.trials}


def test_other_errors_stop_the_search_as_errors():
  p = FakeProgram(error_at=4)
  r = search.find_max_batch(p, budget_bytes=None)
  assert r.error is not None and 'shape mismatch' in r.error
  assert r.trials[-1].outcome == probe.ERROR
  assert r.max_examples == 2  # what was known to fit before the error


def test_nothing_fits():
  p = FakeProgram(a=500, b=1)
  r = search.find_max_batch(p, budget_bytes=100)
  assert r.max_examples == 0 and r.best is None and len(r.trials) == 1


def test_batch_is_reported_in_the_workload_unit():
  p = FakeProgram(a=0, b=1, example_size=30)
  r = search.find_max_batch(p, budget_bytes=100)
  assert r.max_examples == 100
  assert r.trials[0].batch == 30  # one sentence of 30 tokens


def test_verify_predicted_oom_runs_the_oversize_batch():
  p = FakeProgram(a=0, b=1, run_fails_above=10)
  r = search.find_max_batch(p, budget_bytes=10, verify_predicted_oom=True)
  assert r.max_examples == 10
  assert 11 in p.ran  # the failing neighbour was really run


@pytest.mark.parametrize(
  'message, oom',
  [
    ('RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123 bytes', True),
    ('INTERNAL: CUDNN_STATUS_ALLOC_FAILED in autotuning', True),
    ('INTERNAL: Failed to allocate 1073741824 bytes for new constant', True),
    ('INVALID_ARGUMENT: Incompatible shapes for broadcasting', False),
    ('INTERNAL: cuDNN launch failure: CUDNN_STATUS_EXECUTION_FAILED', False),
  ],
)
def test_oom_classification(message, oom):
  assert prog.is_oom(RuntimeError(message)) is oom


def test_max_batch_found_then_measured_on_the_real_tiny_transformer():
  """End to end on XLA:CPU: the boundary under a budget is exact and the max runs again."""
  w = transformer.TRANSFORMER_BIG
  cfg = w.resolve(tiny=True)
  p = prog.Program(w, cfg, precision.get('fp32'))
  peaks = {n: p.compile(n).peak_bytes for n in (8, 9)}
  budget = peaks[8]  # 8 sentences fit exactly, 9 do not
  assert peaks[9] > peaks[8]
  r = search.find_max_batch(p, budget)
  assert r.max_examples == 8, [(t.examples, t.outcome) for t in r.trials]
  m = timing.measure(p, r.best, warmup_steps=1, steps=2, windows=2)
  assert m.finite and len(m.window_step_s) == 2


@pytest.mark.releases
def test_a_failed_trial_leaves_no_arrays_behind():
  """After an out-of-memory at run time nothing of the trial stays alive on the device."""
  w = transformer.TRANSFORMER_BIG
  p = prog.Program(w, w.resolve(tiny=True), precision.get('fp32'))
  compiled = p.compile(2)
  real = compiled.executable

  def fails_after_one_step(state, batch, rng):
    out = real(state, batch, rng)  # allocates a new state, as a real step does
    del out
    raise RuntimeError('RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1 bytes')

  compiled.executable = fails_after_one_step
  p.compile = lambda n: compiled
  gc.collect()
  before = len(jax.live_arrays())
  trial, best = probe.probe(p, 2, budget_bytes=None)
  assert trial.outcome == probe.OOM_RUN and best is None
  assert len(jax.live_arrays()) == before


def test_an_interrupt_during_timing_keeps_the_search_in_the_output(tmp_path, monkeypatch):
  """Ctrl-C (or a queue's SIGINT) after the search: one whole line, status 'interrupted'."""
  from jaxbench import cli
  from jaxbench.cards import emulation
  from jaxbench.core import runner

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

  monkeypatch.setattr(timing, 'measure', interrupted)
  out = tmp_path / 'r.jsonl'
  w = transformer.TRANSFORMER_BIG
  batch = 2 * w.example_size(w.resolve(tiny=True))
  opts = bench.Options(tiny=True, batch_size=batch, steps=1, windows=1, warmup_steps=0)
  plan = cli.Plan('run', (w,), opts, output=str(out))
  memory = backend.MemorySetup(None, None, None, False)
  with pytest.raises(KeyboardInterrupt):
    runner.run(plan, opts, emulation.Request(emulation.SINGLE), memory)
  (line,) = out.read_text().splitlines()
  result = json.loads(line)
  assert result['status'] == 'interrupted' and result['error'].startswith(
    'interrupted while timing'
  )
  (trial,) = result['search']['trials']
  assert trial['outcome'] == 'fits' and trial['examples'] == 2
  assert result['max_batch'] == batch and 'measurement' not in result


def test_sigint_reaches_a_run_stuck_inside_a_long_xla_call():
  """A compile or step runs in a worker thread, so Ctrl-C is not held until XLA returns."""
  release = threading.Event()
  previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
  try:
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
      prog._interruptible(release.wait, 30.0)  # stands in for a call that holds no GIL
    assert time.monotonic() - start < 5.0
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
    release.set()
  assert prog._interruptible(lambda a, b: a + b, 2, 3) == 5
  with pytest.raises(ZeroDivisionError):
    prog._interruptible(lambda: 1 / 0)


def test_sigint_handed_by_the_kernel_to_another_thread_still_interrupts():
  """A process-wide signal may land on any thread (on Linux: when the main thread already has
  one pending, e.g. a queue's SIGUSR1 just before its SIGINT); the waiting main thread still
  sees it within a join slice."""
  release = threading.Event()
  before = set(threading.enumerate())
  previous = signal.signal(signal.SIGUSR2, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))

  def send_to_the_worker():
    time.sleep(0.2)
    (worker,) = [t for t in threading.enumerate() if t.name == 'xla-call' and t not in before]
    signal.pthread_kill(worker.ident, signal.SIGUSR2)

  sender = threading.Thread(target=send_to_the_worker)
  try:
    start = time.monotonic()
    sender.start()
    with pytest.raises(KeyboardInterrupt):
      prog._interruptible(release.wait, 10.0)  # returns after 10 s if the signal is missed
    assert time.monotonic() - start < 5.0
  finally:
    sender.join()
    release.set()
    signal.signal(signal.SIGUSR2, previous)


def test_each_probe_reports_its_compile_and_its_run_as_they_start():
  calls = []

  def on_phase(n, phase, trial):
    calls.append((n, phase, trial and (trial.outcome, trial.predicted_peak_bytes)))

  program = FakeProgram(a=100, b=10, run_fails_above=6)
  found = search.find_max_batch(program, 250, on_phase=on_phase)
  expected = []
  for t in found.trials:
    expected.append((t.examples, probe.COMPILING, None))
    if t.outcome != probe.OOM_PREDICTED:  # its run starts with its forecast known
      expected.append((t.examples, probe.RUNNING, (probe.UNFINISHED, program.peak(t.examples))))
  assert calls == expected
  assert any(t.outcome == probe.OOM_RUN for t in found.trials)  # a run that failed: reported


def test_an_interrupted_run_says_which_probe_it_was_in(monkeypatch):
  """The log has a line as each compile and each run starts; the result names the phase."""

  def interrupted(self, compiled, steps):
    raise KeyboardInterrupt

  monkeypatch.setattr(prog.Program, 'run', interrupted)
  w = registry.get('bert_base')
  lines = []
  memory = backend.MemorySetup(None, None, None, False)
  with pytest.raises(bench.Interrupted) as stop:
    bench.run(w, bench.Options(tiny=True), memory, log=lines.append)
  assert lines[0] == '  bert_base: batch 1 sequences: compiling'
  assert re.fullmatch(r'  bert_base: batch 1 sequences: compiled in \d+\.\d s, running', lines[1])
  assert len(lines) == 2
  result = stop.value.result
  assert result['status'] == 'interrupted'
  assert result['error'] == 'interrupted while searching: running batch 1 sequences'
  # The probe cut in its run keeps its compile and forecast, decided neither way.
  (cut,) = result['search']['trials']
  assert cut['outcome'] == probe.UNFINISHED and cut['examples'] == 1
  assert cut['predicted_peak_bytes'] > 0 and cut['compile_s'] > 0 and cut['run_s'] is None
  assert result['max_examples'] == 0


@pytest.mark.parametrize('policy, want', [('fp32', 'highest'), ('tf32', 'high')])
def test_the_compiled_step_carries_the_policys_matmul_precision(policy, want):
  """The precision context is thread-local and the compile runs in a worker thread: set there."""
  w = registry.get('bert_base')
  program = prog.Program(w, w.resolve(tiny=True), precision.get(policy))
  text = program.compile(1).executable.as_text()
  found = set(re.findall(r'operand_precision=\{(\w+),(\w+)\}', text))
  assert found == {(want, want)}


def test_a_search_stopped_by_max_examples_says_its_max_is_a_lower_bound():
  p = FakeProgram(a=0, b=1)
  capped = search.find_max_batch(p, budget_bytes=1000, max_examples=64)
  assert capped.max_examples == 64 and capped.capped
  exact = search.find_max_batch(FakeProgram(a=0, b=1), budget_bytes=1000)
  assert exact.max_examples == 1000 and not exact.capped
  at_cap = search.find_max_batch(FakeProgram(a=0, b=1), budget_bytes=1000, max_examples=1000)
  assert at_cap.max_examples == 1000 and at_cap.capped  # nothing above the cap was tried


def test_every_trial_starts_from_the_same_initial_state_built_once(tmp_path):
  """The initial state's program is compiled once and run for each trial, whose step donates
  what it gets; on a CPU nothing is kept in the init cache (init_cache.usable)."""
  w = transformer.TRANSFORMER_BIG
  p = prog.Program(w, w.resolve(tiny=True), precision.get('fp32'), init_cache_dir=str(tmp_path))
  compiled = p.compile(2)
  losses = [p.run(compiled, 2) for _ in range(2)]
  first_init_s = p.init_s
  p.run(compiled, 1)
  assert losses[0] == losses[1] and p.init_s == first_init_s > 0
  assert p.init_cached is False and not list(tmp_path.iterdir())


class _Lowered:
  """What init_cache reads of a lowered program; compile() counts its calls."""

  in_tree = out_tree = None

  def __init__(self, text):
    self.text, self.compiles = text, 0

  def as_text(self):
    return self.text

  def compile(self):
    self.compiles += 1
    return f'executable of {self.text}'


def test_the_init_cache_keeps_a_program_loads_it_later_and_replaces_what_it_cannot_load(
  tmp_path, monkeypatch
):
  from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top

  from jaxbench.core import init_cache  # pylint: disable=g-import-not-at-top

  def load(payload, in_tree, out_tree):
    if not payload.startswith(b'serialized '):
      raise ValueError('not an executable')
    return payload.decode().replace('serialized ', 'loaded ')

  monkeypatch.setattr(
    serialize_executable, 'serialize', lambda c: (f'serialized {c}'.encode(), 0, 0)
  )
  monkeypatch.setattr(serialize_executable, 'deserialize_and_load', load)
  first = _Lowered('program A')
  assert init_cache.compile(first, str(tmp_path)) == ('executable of program A', False)
  (entry,) = tmp_path.iterdir()  # one entry, written whole (no temporary file left)
  later = _Lowered('program A')
  assert init_cache.compile(later, str(tmp_path)) == ('loaded executable of program A', True)
  assert later.compiles == 0
  other = _Lowered('program B')  # another program: another key
  assert init_cache.compile(other, str(tmp_path))[1] is False and len(list(tmp_path.iterdir())) == 2
  entry.write_bytes(b'garbage')
  again = _Lowered('program A')
  assert init_cache.compile(again, str(tmp_path)) == ('executable of program A', False)
  assert entry.read_bytes() == b'serialized executable of program A'
  assert init_cache.compile(_Lowered('program A'), None) == ('executable of program A', False)
  unwritable = tmp_path / 'file'
  unwritable.write_text('')
  assert init_cache.compile(_Lowered('program C'), str(unwritable)) == (
    'executable of program C',
    False,
  )


def _earlier(n, outcome, peak, when='2026-12-01T04:52:30+00:00'):
  return probe.Trial(n, n, outcome, predicted_peak_bytes=peak, compile_s=300.0, earlier=when)


def test_a_resumed_search_compiles_only_what_the_earlier_run_left_and_the_max_again():
  """360 fitted and 362 was predicted over in an earlier process: this one compiles 361 and, to
  time it, the largest fit again; the earlier trials are reported with their run's time."""
  p = FakeProgram(a=0, b=10)  # fits up to 361 under 3615
  known = [_earlier(360, probe.FITS, 3600), _earlier(362, probe.OOM_PREDICTED, 3620)]
  found = search.find_max_batch(p, 3615, known=known)
  assert found.max_examples == 361 and found.best.n == 361
  assert p.compiled == [361] and p.ran == [361]
  assert [(t.examples, t.earlier is None) for t in found.trials] == [
    (360, False),
    (362, False),
    (361, True),
  ]


def test_a_search_resumed_at_its_boundary_compiles_and_runs_the_max_once():
  p = FakeProgram(a=0, b=10)
  known = [_earlier(361, probe.FITS, 3610), _earlier(362, probe.OOM_PREDICTED, 3620)]
  found = search.find_max_batch(p, 3615, known=known)
  assert found.max_examples == 361 and found.best is not None and found.error is None
  assert p.compiled == [361] and p.ran == [361]


def test_a_resumed_fit_that_ran_and_fails_now_stops_the_search_with_an_error():
  p = FakeProgram(a=0, b=10, run_fails_above=300)
  known = [_earlier(361, probe.FITS, 3610), _earlier(362, probe.OOM_PREDICTED, 3620)]
  known[0].run_s = 40.0  # it ran in the earlier run
  found = search.find_max_batch(p, 3615, known=known)
  assert found.error == '361 examples ran in an earlier run and not in this one (oom_run)'
  assert found.max_examples == 0  # nothing ran in this search


def test_a_resumed_fit_by_forecast_that_fails_now_moves_the_search_below_it():
  """The earlier run was cut before it could run its max (--norun_every_fit): no disagreement,
  the forecast was wrong there, and the search goes on below with every fit run."""
  p = FakeProgram(a=0, b=10, run_fails_above=300)
  known = [_earlier(361, probe.FITS, 3610), _earlier(362, probe.OOM_PREDICTED, 3620)]
  found = search.find_max_batch(p, 3615, known=known, run_every_fit=False)
  assert found.error is None and found.max_examples == 300 and found.best.n == 300
  assert len(p.ran) <= 12


def test_a_resume_where_nothing_fitted_compiles_nothing():
  p = FakeProgram(a=5000, b=10)
  found = search.find_max_batch(p, 3615, known=[_earlier(1, probe.OOM_PREDICTED, 5010)])
  assert found.max_examples == 0 and p.compiled == [] and found.error is None


def test_earlier_trials_that_disagree_are_refused():
  known = [_earlier(10, probe.FITS, 100), _earlier(5, probe.OOM_RUN, 50)]
  known[0].run_s = 1.0  # 10 ran, 5 did not (hints.decided keeps only the later of such pairs)
  with pytest.raises(ValueError, match='disagree'):
    search.find_max_batch(FakeProgram(), 1000, known=known)


@pytest.fixture(scope='module')
def plain_bert_search():
  """(workload, memory, options, result) of one plain search of tiny bert_base under a 4 MB
  budget (some 20 sequences; the CPU's default budget fits some 1,500, each fit's step seconds
  long): the same run starts each of the three tests below that compare another search with it,
  so it runs once a test process."""
  w = registry.get('bert_base')
  memory = backend.MemorySetup(None, 4_000_000, None, False)
  opts = bench.Options(tiny=True, steps=1, windows=1, warmup_steps=0)
  return w, memory, opts, bench.run(w, opts, memory)


def test_a_resumed_search_in_bench_records_where_each_trial_came_from(tmp_path, plain_bert_search):
  """Two processes' worth of one search on the tiny transformer: the second starts from the
  first one's record, compiles fewer probes, and reports both runs' trials."""
  w, memory, _, first = plain_bert_search
  first = copy.deepcopy(first)
  assert first['status'] == 'ok'
  path = tmp_path / 'first.jsonl'
  path.write_text(json.dumps(first) + '\n')
  opts = bench.Options(
    tiny=True, steps=1, windows=1, warmup_steps=0, search_hints=(str(path),), search_resume=True
  )
  lines = []
  second = bench.run(w, opts, memory, log=lines.append)
  assert second['status'] == 'ok' and second['max_batch'] == first['max_batch']
  assert second['search']['resumed'] == {
    'trials': len(first['search']['trials']),
    'by_forecast': 0,  # every forecast of the first run is one of its decided trials
    'runs': [first['timestamp']],
  }
  # The max, built again to be timed: compiled, or loaded where the test run's compilation cache
  # holds it (tests/conftest.py).
  assert second['search']['compiles'] + second['search']['cache_loads'] == 1
  earlier = [t for t in second['search']['trials'] if t['earlier']]
  assert {t['examples'] for t in earlier} == {t['examples'] for t in first['search']['trials']}
  assert lines[0].startswith('  bert_base: resumed from ')


def test_without_run_every_fit_only_the_largest_fit_runs_and_the_answer_is_the_same():
  default, lazy = FakeProgram(a=0, b=10), FakeProgram(a=0, b=10)
  want = search.find_max_batch(default, 3615)
  got = search.find_max_batch(lazy, 3615, run_every_fit=False)
  assert got.max_examples == want.max_examples == 361 and got.best.n == 361
  assert lazy.compiled == default.compiled  # the same probes
  assert len(default.ran) > 1 and lazy.ran == [361]  # one run, of the max
  last = got.trials[-1]
  assert (last.examples, last.outcome, last.compile_s) == (361, probe.FITS, None)
  assert last.run_s is not None
  assert all(t.run_s is None for t in got.trials[:-1])  # the probes compiled only


def test_without_run_every_fit_a_max_that_fails_when_run_moves_the_search_below_it():
  """The forecast says 361 fits; the device runs out above 300: the same max as a search that
  runs every fit, each candidate max run before it is accepted."""
  want = search.find_max_batch(FakeProgram(a=0, b=10, run_fails_above=300), 3615)
  lazy = FakeProgram(a=0, b=10, run_fails_above=300)
  got = search.find_max_batch(lazy, 3615, run_every_fit=False)
  assert got.max_examples == want.max_examples == 300 and got.error is None
  assert got.best.n == 300 and 300 in lazy.ran  # the max ran
  assert any(t.outcome == probe.OOM_RUN for t in got.trials)


def test_a_resumed_forecast_fit_is_compiled_and_run_here_before_it_is_the_max():
  p = FakeProgram(a=0, b=10)
  known = [_earlier(361, probe.FITS, 3610), _earlier(362, probe.OOM_PREDICTED, 3620)]
  known[0].run_s = None  # the earlier run decided it by its forecast only
  found = search.find_max_batch(p, 3615, known=known, run_every_fit=False)
  assert found.max_examples == 361 and p.compiled == [361] and p.ran == [361]


def test_a_search_that_runs_only_its_max_on_the_tiny_transformer(plain_bert_search):
  w, memory, opts, every = plain_bert_search
  every = copy.deepcopy(every)
  lazy = bench.run(w, dataclasses.replace(opts, run_every_fit=False), memory)
  assert lazy['status'] == every['status'] == 'ok'
  assert lazy['max_batch'] == every['max_batch']
  assert lazy['search']['run_every_fit'] is False and every['search']['run_every_fit'] is True
  ran = [t for t in lazy['search']['trials'] if t['run_s'] is not None]
  assert [(t['examples'], t['compile_s']) for t in ran] == [(lazy['max_examples'], None)]
  built = lambda r: r['search']['compiles'] + r['search']['cache_loads']
  assert built(lazy) == built(every)


def test_an_interrupted_search_counts_as_run_only_the_batches_that_ran(monkeypatch):
  """With --norun_every_fit a fit by forecast has not run: not 'the largest batch that ran'."""
  real_compile = prog.Program.compile
  compiles = []

  def compile_then_stop(self, n):
    compiles.append(n)
    if len(compiles) == 3:
      raise KeyboardInterrupt
    return real_compile(self, n)

  monkeypatch.setattr(prog.Program, 'compile', compile_then_stop)
  w = registry.get('bert_base')
  memory = backend.MemorySetup(None, None, None, False)
  with pytest.raises(bench.Interrupted) as stop:
    bench.run(w, bench.Options(tiny=True, run_every_fit=False), memory)
  result = stop.value.result
  assert [t['outcome'] for t in result['search']['trials']][:1] == ['fits']
  assert result['max_examples'] == 0


@pytest.mark.parametrize('fails_above', [300, 200, 30])
def test_a_wrong_forecast_costs_a_lazy_search_no_more_runs_than_running_every_fit(fails_above):
  """Once the max by forecast fails when run, every later fit runs: the search then costs what a
  search that runs every fit does (a handful more compiles), not a step down per batch."""
  default = FakeProgram(a=0, b=10, run_fails_above=fails_above)
  lazy = FakeProgram(a=0, b=10, run_fails_above=fails_above)
  want = search.find_max_batch(default, 3615)
  got = search.find_max_batch(lazy, 3615, run_every_fit=False)
  assert got.max_examples == want.max_examples == fails_above and got.error is None
  assert len(lazy.ran) <= len(default.ran) + 2
  assert len(lazy.compiled) <= len(default.compiled) + 6


@pytest.mark.parametrize('budget, verify', [(None, False), (3615, True)])
def test_a_lazy_search_runs_every_fit_without_a_budget_or_when_verifying_ooms(budget, verify):
  p = FakeProgram(a=0, b=10, run_fails_above=300)
  got = search.find_max_batch(
    p, budget, max_examples=4096, verify_predicted_oom=verify, run_every_fit=False
  )
  assert got.max_examples == 300 and got.error is None
  assert all(t.run_s is not None for t in got.trials if t.outcome != probe.OOM_PREDICTED)


def test_earlier_fits_above_the_cap_do_not_make_the_max():
  p = FakeProgram(a=0, b=10)
  known = [_earlier(361, probe.FITS, 3610), _earlier(362, probe.OOM_PREDICTED, 3620)]
  found = search.find_max_batch(p, 3615, max_examples=100, known=known)
  assert found.max_examples == 100 and found.capped and p.ran[-1] == 100


def test_an_error_reports_as_its_max_the_largest_batch_that_ran_in_the_search():
  p = FakeProgram(a=0, b=10, error_at=362)
  found = search.find_max_batch(p, 3615, hints={1: 10, 361: 3610}, run_every_fit=False)
  assert found.error is not None and 'shape mismatch' in found.error
  assert found.max_examples == 0  # 361 fitted by its forecast only


def test_hints_off_by_a_few_percent_aim_through_the_searchs_own_forecast():
  """Deviceless hints run a few percent off the device's forecast: once the first probe shows
  it (the same batch, another peak), the line goes through this search's own forecast with the
  hints' slope, not through one point of each (which aimed one example below the first probe)."""
  p = FakeProgram(a=800, b=100)  # 800 bytes more than the hints say (autotuned workspaces)
  hints = {1: 100, 118: 11_800, 165: 16_500, 166: 16_600, 167: 16_700}
  got = search.find_max_batch(p, 16_620, run_steps=0, hints=hints)
  assert got.max_examples == 158
  assert p.compiled == [166, 158, 159]  # without the rule: 166, 165, ...


def test_cheap_probes_then_one_autotuned_compile_when_the_forecasts_agree():
  """--probe_autotune_level: the probes compile the cheap program only; the program itself
  compiles and runs the max alone, and the answer is the plain search's."""
  want = search.find_max_batch(FakeProgram(a=0, b=10), 3615)
  cheap, real, seen = FakeProgram(a=0, b=10), FakeProgram(a=0, b=10), []
  got, check = probing.find_max_batch_probing(real, cheap, 0, 3615, on_trial=seen.append)
  assert got.max_examples == want.max_examples == 361 and got.best.n == 361
  assert cheap.ran == [] and len(cheap.compiled) >= 2  # compile-only probes
  assert real.compiled == [361] and real.ran == [361]  # one autotuned compile, run
  assert check == probing.ProbeCheck(361, 3610, 3610, True)
  assert [t.autotune_level for t in got.trials] == [0] * len(cheap.compiled) + [None]
  assert seen == got.trials  # every trial reported as it ends
  assert got.trials[-1].run_s is not None and all(t.run_s is None for t in got.trials[:-1])


@pytest.mark.parametrize('real_a', [-25, 25])  # the autotuned program forecasts less, or more
def test_forecasts_that_differ_send_the_search_on_autotuned_to_the_same_answer(real_a):
  want = search.find_max_batch(FakeProgram(a=real_a, b=10), 3615)
  real = FakeProgram(a=real_a, b=10)
  got, check = probing.find_max_batch_probing(real, FakeProgram(a=0, b=10), 0, 3615)
  assert not check.equal and check.examples == 361
  assert got.max_examples == want.max_examples and got.error is None
  assert got.best.n == got.max_examples and got.max_examples in real.ran
  autotuned = [t for t in got.trials if t.autotune_level is None]
  assert {t.examples for t in autotuned} >= {got.max_examples, got.max_examples + 1}


def test_the_checks_log_line_gives_both_forecasts_when_they_differ():
  text = search_log.probe_check_text
  assert text(probing.ProbeCheck(360, 3600, 3600, True)) == 'the same bytes'
  differ = text(probing.ProbeCheck(360, 142_191_083_344, 142_189_413_968, False))
  assert "142,189,413,968 B against the probe's 142,191,083,344 B" in differ
  assert 'no forecast' in text(probing.ProbeCheck(360, 3600, None, False))


def test_a_max_that_fails_its_run_sends_the_search_on_autotuned():
  real = FakeProgram(a=0, b=10, run_fails_above=300)
  got, check = probing.find_max_batch_probing(real, FakeProgram(a=0, b=10), 0, 3615)
  assert check.equal  # the forecasts agree; the device does not
  assert got.max_examples == 300 and got.best.n == 300 and 300 in real.ran


def test_probing_where_nothing_fits_compiles_nothing_autotuned():
  real = FakeProgram(a=5000, b=10)
  got, check = probing.find_max_batch_probing(real, FakeProgram(a=5000, b=10), 0, 3615)
  assert got.max_examples == 0 and check is None and real.compiled == []


def test_probing_on_the_tiny_transformer_finds_the_plain_searchs_max(tmp_path, plain_bert_search):
  """On the CPU the autotune level changes nothing, so the check must pass; the record says
  which trials were probes (and hints of a later run leave them out as another program's)."""
  w, memory, opts, plain = plain_bert_search
  plain = copy.deepcopy(plain)
  lines = []
  probed = bench.run(w, dataclasses.replace(opts, probe_autotune_level=0), memory, lines.append)
  assert probed['status'] == plain['status'] == 'ok'
  assert probed['max_batch'] == plain['max_batch']
  n = probed['max_examples']
  assert probed['search']['probe'] == {
    'autotune_level': 0,
    'check': {
      'examples': n,
      'probe_peak_bytes': probed['measurement']['predicted_peak_bytes'],
      'peak_bytes': probed['measurement']['predicted_peak_bytes'],
      'equal': True,
    },
  }
  trials = probed['search']['trials']
  assert all(t['autotune_level'] == 0 and t['run_s'] is None for t in trials[:-1])
  assert trials[-1]['autotune_level'] is None and trials[-1]['examples'] == n
  assert any('[autotune level 0]' in line for line in lines)
  assert any('the same bytes' in line for line in lines)
  path = tmp_path / 'probed.jsonl'
  path.write_text(json.dumps(probed) + '\n')
  assert set(hints.forecasts([str(path)], probed)) == {n}  # the autotuned compile only
