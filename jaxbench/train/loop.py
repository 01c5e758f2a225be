"""Train one workload for a number of steps, saving Orbax checkpoints to resume from.

The checkpoint holds the whole train state (parameters, optimizer state, loss scale, the step),
the keys of the step's and the data's randomness, and a record: the data position and the loss
curve so far. A run resumed from step k is the uninterrupted run from step k on: the step draws
its randomness from its key and the state's step counter, the data its batch from the position.
Saves are asynchronous: a step pays for the copy of the state off the device, not the writing.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import time
from typing import Any

import jax
import numpy as np

from jaxbench import cli
from jaxbench.core import backend, bench, init_cache, run_record, search, search_log
from jaxbench.core import program as prog
from jaxbench.results import records as report
from jaxbench.train import checkpoint, data, recipes, tfds_data
from models import precision

SCHEMA = 'jaxbench.train/1'
# Steps on a synthetic batch after a --data=tfds run, the speed its input is compared with.
SYNTHETIC_PROBE_STEPS = 20
# Real data below this fraction of the synthetic speed: the input is the bottleneck.
INPUT_BOUND_BELOW = 0.9


class _Refused(Exception):
  """The checkpoints cannot be resumed by this run: one line, status 2."""


class _Stop:
  """SIGTERM and SIGINT while training: remembered, acted on after the current step (which
  then saves), instead of ending the process mid-step."""

  def __init__(self):
    self.signum: int | None = None
    self._before = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._before[sig] = signal.signal(sig, self._note)
    return self

  def _note(self, signum, frame) -> None:
    del frame
    self.signum = self.signum or signum

  def __exit__(self, *exc) -> None:
    for sig, handler in self._before.items():
      signal.signal(sig, handler)


def _median(xs: list[float]) -> float | None:
  return statistics.median(xs) if xs else None


def run(
  plan: cli.Plan, options: bench.Options, memory: backend.MemorySetup, out: int | None, log
) -> int:
  """Train plan.workloads[0] for plan.train.steps; the exit status (0 trained, 1 a failure,
  2 a checkpoint directory of another run, 128 + the signal's number when one stopped it)."""
  w, train = plan.workloads[0], plan.train
  policy = precision.get(options.precision or w.default_precision)
  cfg = w.resolve(tiny=options.tiny, overrides=dict(options.overrides))
  record: dict[str, Any] = {
    **run_record.identity(w, cfg, policy, options.tiny, run_record.device_info()),
    'schema': SCHEMA,
    'timestamp': run_record.now(),
  }
  found = checkpoint.read_identity(train.checkpoint_dir) if train.checkpoint_dir else None
  batch = options.batch_size or (found or {}).get('batch')
  log(
    f'{w.name}: training {train.steps} steps'
    + (f' at batch {batch} {w.unit}' if batch else ', at the max batch the search finds')
    + (' (tiny preset)' if options.tiny else '')
  )
  program = prog.Program(w, cfg, policy, seed=options.seed, init_cache_dir=init_cache.default_dir())
  record['params'] = program.param_counts()
  compiled = _compile(program, w, cfg, options, memory, batch, record, log)
  if compiled is None:
    log(f'{w.name}: {record["status"]}: {record["error"]}')
    _store(out, plan.output, record, log)
    return 1
  if options.batch_size is None and batch is not None:
    record['search'] = {'mode': 'checkpoint'}  # the batch the checkpoints were trained at
  batch = compiled.n * w.example_size(cfg)
  record['batch'] = batch
  ident = checkpoint.identity(w.name, w.revision, cfg, policy.name, batch, options.seed)
  ckpts = None
  if train.checkpoint_dir:
    refused = found and checkpoint.refusal(train.checkpoint_dir, found, ident)
    if refused:
      log(f'jaxbench: error: --checkpoint_dir: {refused}')
      return 2
    os.makedirs(train.checkpoint_dir, exist_ok=True)
    if found is None:
      checkpoint.write_identity(train.checkpoint_dir, ident)
    ckpts = checkpoint.Checkpoints(train.checkpoint_dir, train.keep, log)
  try:
    status = _train(program, compiled, w, train, ckpts, record, log)
  except _Refused as e:
    log(f'jaxbench: error: {e}')
    return 2
  except recipes.DataError as e:
    log(f'jaxbench: error: {e}')
    return 2
  finally:
    if ckpts is not None:
      ckpts.wait()  # the last save whole on disk before the process ends
      ckpts.close()
  _store(out, plan.output, record, log)
  t = record['train']
  curve = t['loss_curve']
  print(
    f'{w.name}: trained to step {t["step"]} of {train.steps} at batch {batch} {w.unit}'
    + (f' (resumed from step {t["resumed_from"]})' if t['resumed_from'] else '')
    + (f', loss {curve[-1][1]:.4f}' if curve else '')
    + _times_text(t['step_s'])
    + _input_text(t.get('input')),
    flush=True,
  )
  return status


def _compile(program, w, cfg, options, memory, batch, record, log):
  """The step compiled at `batch` (None: the max batch the search finds); None if it fails,
  with the record's status and error saying why."""
  start = time.perf_counter()
  try:
    if batch is not None:
      compiled = program.compile(run_record.examples_for(w, cfg, batch))
      record['search'] = {'mode': 'fixed'}
    else:
      budget, _ = run_record.memory_budget(memory, run_record.on_gpu())
      found = search.find_max_batch(
        program,
        budget,
        options.max_examples,
        options.verify_predicted_oom,
        on_trial=lambda t: log(search_log.trial_line(w, t)),
        tolerance=options.search_tolerance,
      )
      record['search'] = {'mode': 'search', 'trials': len(found.trials)}
      if found.best is None:
        record.update(status='oom' if found.error is None else 'error')
        record['error'] = found.error or 'not even one example fits'
        return None
      compiled = found.best
  except Exception as e:  # pylint: disable=broad-except
    record.update(status='oom' if prog.is_oom(e) else 'error', error=prog.first_line(e))
    return None
  record['compile_s'] = round(time.perf_counter() - start, 3)
  return compiled


def _train(program, compiled, w, train, ckpts, record, log) -> int:
  """The loop: record['train'] says how far it got; returns the exit status."""
  rng = program.rng
  arrays = {
    'state': program.initial_state(),
    'rng': {
      'step': jax.random.key_data(rng),
      'data': jax.random.key_data(jax.random.fold_in(rng, 2)),
    },
  }
  curve: list[list[float]] = []
  start = 0
  restored = ckpts.restore_latest(arrays) if ckpts is not None else None
  if restored is not None:
    start, arrays, saved = restored
    curve = [p for p in saved['loss_curve'] if p[0] <= start]
    if saved.get('source', 'synthetic') != train.data:
      raise _Refused(
        f'--data={train.data}: the checkpoints in {ckpts.directory} were trained on '
        f'{saved.get("source", "synthetic")} batches'
      )
    log(f'{w.name}: resumed from the checkpoint of step {start} in {ckpts.directory}')
  source = _source(program, compiled.n, train, arrays['rng']['data'])
  try:
    return _loop(program, compiled, w, train, ckpts, record, log, arrays, curve, start, source)
  finally:
    source.close()


def _source(program, examples, train, data_key):
  """The run's batches: synthetic, or the workload's TFDS dataset (--data=tfds)."""
  key = jax.random.wrap_key_data(data_key)
  if train.data == 'synthetic':
    return data.Synthetic(program.trainer.make_batch, key, examples)
  recipe = recipes.recipe(program.workload.name)
  records = tfds_data.open_records(recipe, train.data_dir)
  seed = tuple(int(x) for x in np.asarray(data_key).ravel())
  return tfds_data.source(recipe, program.cfg, records, examples, seed)


def _loop(program, compiled, w, train, ckpts, record, log, arrays, curve, start, source) -> int:
  """The steps from `start` on; record['train'] says how far they got."""
  state = arrays['state']
  step_rng = jax.random.wrap_key_data(arrays['rng']['step'])
  step, saved_steps, status = start, [], 0
  times = {'saving': [], 'quiet': [], 'save_call': [], 'input': []}
  t = record['train'] = {
    'steps': train.steps,
    'resumed_from': start or None,
    'checkpoint_dir': ckpts.directory if ckpts else None,
    'checkpoint_every': train.every,
    'checkpoint_keep': train.keep,
    'log_every': train.log_every,
  }

  def save() -> None:
    begin = time.perf_counter()
    ckpts.save(step, arrays, {'step': step, **source.describe(step), 'loss_curve': curve})
    times['save_call'].append(time.perf_counter() - begin)
    saved_steps.append(step)

  with _Stop() as stop:
    while step < train.steps and stop.signum is None:
      begin = time.perf_counter()
      try:
        batch = source.batch(step)
      except Exception as e:  # pylint: disable=broad-except  (a record that cannot be read)
        record.update(status='error', error=f'input: {prog.first_line(e)}')
        status = 1
        break
      times['input'].append(time.perf_counter() - begin)
      in_flight = ckpts is not None and ckpts.saving()
      begin = time.perf_counter()
      try:
        # The state is donated to the step (Program jits it so): a save before it has copied it.
        state, metrics = compiled.executable(state, batch, step_rng)
        loss = float(np.asarray(metrics['loss']))
      except Exception as e:  # pylint: disable=broad-except  (e.g. out of memory at run time)
        record.update(status='oom' if prog.is_oom(e) else 'error', error=prog.first_line(e))
        status = 1
        break
      elapsed = time.perf_counter() - begin
      in_flight = in_flight or (ckpts is not None and ckpts.saving())
      times['saving' if in_flight else 'quiet'].append(elapsed)
      step += 1
      arrays = {**arrays, 'state': state}
      if not math.isfinite(loss):
        record.update(status='invalid', error=f'loss not finite at step {step}: {loss}')
        status = 1
        break
      if step % train.log_every == 0 or step == train.steps:
        curve.append([step, loss])
        median = _median(times['saving'] + times['quiet'])
        log(f'{w.name}: step {step}/{train.steps}: loss {loss:.4f}, {median * 1e3:.1f} ms/step')
      if ckpts is not None and (step % train.every == 0 or step == train.steps):
        save()
    if status == 0 and ckpts is not None and step > start and step not in saved_steps:
      save()  # stopped by a signal between two saves
    if stop.signum is not None and status == 0:
      name = signal.Signals(stop.signum).name
      record.update(status='interrupted', error=f'stopped by {name} at step {step}')
      log(f'{w.name}: {name}: stopped at step {step}' + (', saved' if ckpts else ''))
      status = 128 + stop.signum
  if status == 0 and source.kind != 'synthetic' and times['input']:
    source.close()  # no batches read ahead on the host while the synthetic steps are timed
    try:
      t['input'] = _input_bound(program, compiled, state, step_rng, times)
    except Exception as e:  # pylint: disable=broad-except  (the trained state is saved)
      t['input'] = {'error': prog.first_line(e)}
  record.setdefault('status', 'ok')
  record.setdefault('error', None)
  t.update(
    step=step,
    data=source.describe(step),
    saved_steps=saved_steps,
    loss_curve=curve,
    step_s={
      # Each step's time from its dispatch to its loss on the host; a step with a save still
      # being written (during it or at its end) counts apart from those without.
      'median': _median(times['saving'] + times['quiet']),
      'median_saving': _median(times['saving']),
      'median_not_saving': _median(times['quiet']),
      'steps_saving': len(times['saving']),
      'steps_not_saving': len(times['quiet']),
      # What a save costs the loop: the copy off the device, before the writing goes on.
      'median_save_call': _median(times['save_call']),
    },
  )
  return status


def _input_bound(program, compiled, state, step_rng, times) -> dict[str, Any]:
  """Whether input was the bottleneck: the steps/s with real data (each step's wait for its
  batch and the step) over the steps/s of the same step on a synthetic batch already on the
  device, timed for SYNTHETIC_PROBE_STEPS steps after the run (their state is not saved)."""
  fake_source = data.Synthetic(program.trainer.make_batch, program.rng, compiled.n)
  batch = jax.block_until_ready(fake_source.batch(0))
  synthetic = []
  for _ in range(SYNTHETIC_PROBE_STEPS):
    begin = time.perf_counter()
    state, metrics = compiled.executable(state, batch, step_rng)
    float(np.asarray(metrics['loss']))
    synthetic.append(time.perf_counter() - begin)
  steps = times['saving'] + times['quiet']
  real = statistics.median(wait + step for wait, step in zip(times['input'], steps))
  fake = statistics.median(synthetic)
  ratio = fake / real
  return {
    'median_wait_s': statistics.median(times['input']),
    'median_real_step_s': real,
    'median_synthetic_step_s': fake,
    'synthetic_steps': len(synthetic),
    'real_over_synthetic': ratio,  # steps/s with real data over steps/s with synthetic data
    'input_bound': ratio < INPUT_BOUND_BELOW,
  }


def _input_text(s: dict[str, Any] | None) -> str:
  if not s:
    return ''
  if 'error' in s:
    return f'; the synthetic steps to compare the input with failed: {s["error"]}'
  return (
    f'; real data at {s["real_over_synthetic"]:.0%} of the synthetic steps/s (waits '
    f'{s["median_wait_s"] * 1e3:.2f} ms for a batch): '
    + ('input is the bottleneck' if s['input_bound'] else 'input is not the bottleneck')
  )


def _times_text(s: dict[str, Any]) -> str:
  if s['median'] is None:
    return ''
  text = f'; median step {s["median"] * 1e3:.2f} ms'
  if s['median_saving'] is not None and s['median_not_saving'] is not None:
    text += (
      f' ({s["median_saving"] * 1e3:.2f} ms with a save being written, '
      f'{s["median_not_saving"] * 1e3:.2f} ms without)'
    )
  if s['median_save_call'] is not None:
    text += f', {s["median_save_call"] * 1e3:.2f} ms to start a save'
  return text


def _store(out: int | None, path: str | None, record: dict[str, Any], log) -> None:
  """Append the record to --output; if that fails, it goes whole to stderr."""
  if out is None:
    return
  try:
    report.write_jsonl(out, record, path)
  except OSError as e:
    log(f'jaxbench: error: --output: cannot write {path} ({e.strerror or e}); the result follows')
    log(report.json_line(record))
