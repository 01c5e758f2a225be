"""Run a validated plan: each workload searched (or predicted), timed, reported, stored.

The progress of a run (each workload's header, each probe) goes to stderr; its results (the
table and its notes, or the predictions) to stdout.
"""

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
  """Returns the exit status: 0 when every result is ok or out of memory, else 1.

  `target`: with --predict, the described GPU to compile for (jaxbench.cards.deviceless).
  """
  predicting = req.kind == emulation.PREDICT
  gpu = req.gpus[0] if req.gpus and not predicting else None
  results = []

  def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

  def annotated(record: dict) -> dict:
    # A prediction's records carry their own card (predict annotates each one).
    return record if predicting else emulation.annotate(record, gpu, options.overrides)

  checkpoint = None
  if plan.progress_file:
    # The result so far, whole, replaced after each trial and change of phase, and removed
    # once the run has written its own: what a run killed before it could (a SIGKILL, a
    # lost machine) had found; a prediction's, the card it is searching.
    def checkpoint(record: dict) -> None:
      report.replace_json(plan.progress_file, annotated(record))

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
        if plan.output:
          report.append_jsonl(plan.output, result)  # each result whole, as soon as it exists
        report.discard(plan.progress_file)
    except bench.Interrupted as stop:
      # What the search found is kept (status 'interrupted'); a sweep reruns such a cell.
      result = annotated(stop.result)
      if plan.output:
        report.append_jsonl(plan.output, result)
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
  return 0 if all(r['status'] in ('ok', 'oom') for r in results) else 1
