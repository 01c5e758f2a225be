"""Run a validated plan: each workload searched (or predicted), timed, reported, stored.

The progress of a run (each workload's header, each probe) goes to stderr; its results (the
table and its notes, or the predictions) to stdout.
"""

import os
import sys
from typing import Any

from jaxbench import cli
from jaxbench.cards import emulation, predict
from jaxbench.core import backend, bench
from jaxbench.results import records as report


def _what(predicting: bool, options: bench.Options, target: Any = None) -> str:
  if predicting:
    return 'compile-only prediction' + (f' for {target.device_kind}' if target else '')
  return 'max-batch search' if options.batch_size is None else 'fixed batch'


def run(
  plan: cli.Plan,
  options: bench.Options,
  req: Any,
  memory: backend.MemorySetup,
  target: Any = None,
) -> int:
  """Returns the exit status: 0 when every result is ok or out of memory and stored, else 1
  (2 when --output cannot be opened: nothing has run).

  `target`: with --predict, the described GPU to compile for (jaxbench.cards.deviceless).
  """

  def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

  # The output is opened before any work, so a run cannot end with nowhere to put its result.
  try:
    out = report.open_append(plan.output) if plan.output else None
  except OSError as e:
    log(f'jaxbench: error: --output: cannot write {plan.output}: {e.strerror}')
    return 2
  try:
    if plan.train is not None:  # training instead of timing: its own loop and record
      from jaxbench.train import loop  # pylint: disable=g-import-not-at-top

      return loop.run(plan, options, memory, out, log)
    return _run(plan, options, req, memory, target, out, log)
  finally:
    if out is not None:
      os.close(out)


def _run(plan, options, req, memory, target, out, log) -> int:
  predicting = req.kind == emulation.PREDICT
  gpu = req.gpus[0] if req.gpus and not predicting else None
  results = []
  lost = []

  def store(result: dict) -> None:
    """Append the result to --output; if that fails, the result goes whole to stderr."""
    if out is None:
      return
    try:
      report.write_jsonl(out, result, plan.output)
    except OSError as e:
      lost.append(result['workload'])
      log(
        f'jaxbench: error: --output: cannot write {plan.output} ({e.strerror or e}); '
        f'the result of {result["workload"]} is the next line'
      )
      log(report.json_line(result))

  def annotated(record: dict) -> dict:
    # A prediction's records carry their own card (predict annotates each one).
    return record if predicting else emulation.annotate(record, gpu, options.overrides)

  checkpoint = None
  if plan.progress_file:
    # The result so far, whole, replaced after each trial and change of phase, and removed
    # once the run has written its own: what a run killed before it could (a SIGKILL, a
    # lost machine) had found; a prediction's, the card it is searching.
    def checkpoint(record: dict) -> None:
      try:
        report.replace_json(plan.progress_file, annotated(record))
      except OSError as e:  # the progress is an aid: the run goes on without it
        log(f'jaxbench: warning: --progress_file: cannot write {plan.progress_file}: {e.strerror}')

  for w in plan.workloads:
    log(f'{w.name}: {_what(predicting, options, target)}{" (tiny preset)" if options.tiny else ""}')
    try:
      if predicting:
        produced = predict.predict(
          w, options, list(req.gpus), plan.remat, log, target, checkpoint=checkpoint
        )
      else:
        produced = [annotated(bench.run(w, options, memory, log, checkpoint))]
      for result in produced:
        results.append(result)
        store(result)  # each result whole, as soon as it exists
        report.discard(plan.progress_file)
    except bench.Interrupted as stop:
      # What the search found is kept (status 'interrupted'); a sweep reruns such a cell.
      result = annotated(stop.result)
      store(result)
      report.discard(plan.progress_file)
      if predicting:
        print('\n'.join(predict.line(r) for r in [*results, result]), flush=True)
      else:
        print(report.notes([result]), flush=True)
      raise
  if predicting:  # each was logged as it was found; here they are the command's output
    print('\n'.join(predict.line(r) for r in results), flush=True)
  else:
    print()
    print(report.table(results))
    print(report.notes(results))
    for r in results:
      if r['emulation']:
        print(f"{r['workload']}: {r['emulation']['how']}, as a {r['emulation']['display']}")
  return 0 if not lost and all(r['status'] in ('ok', 'oom') for r in results) else 1
