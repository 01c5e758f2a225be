"""jaxbench's entry point, intentionally kept short: parse flags, validate, dispatch.

    python -m jaxbench.main --model=transformer_big
"""

import sys

from absl import flags

from flags import run as run_flags
from flags import search as search_flags

FLAGS = flags.FLAGS


def _fail(message: str) -> None:
  print(f'jaxbench: error: {message}', file=sys.stderr)
  sys.exit(2)


def main(argv: list[str]) -> int:
  try:
    extra = FLAGS(argv)[1:]
  except flags.Error as e:
    _fail(str(e).splitlines()[0])
  if extra:
    _fail(f'unexpected arguments: {" ".join(extra)}')
  from jaxbench import backend  # pylint: disable=g-import-not-at-top

  # XLA reads its memory and compiler options once, when the backend starts,
  # and importing a model may start it: configure first, import the rest after.
  limit = search_flags.MEMORY_LIMIT_GB.value
  if limit is not None and limit <= 0:
    _fail(f'--memory_limit_gb must be positive, got {limit}')
  try:
    memory = backend.configure(limit, search_flags.REMAT.value,
                               search_flags.COMPILATION_CACHE_DIR.value,
                               search_flags.TRITON_GEMM.value)
  except backend.BackendError as e:
    _fail(str(e))
  from jaxbench import bench, cli, describe, report  # pylint: disable=g-import-not-at-top

  try:
    plan = cli.plan(FLAGS)
  except cli.UsageError as e:
    _fail(str(e))
  if plan.action == 'list':
    print('\n'.join(describe.list_line(w) for w in plan.workloads))
    return 0
  if plan.action == 'describe':
    for w in plan.workloads:
      print(describe.describe(w, plan.options.tiny, dict(plan.options.overrides)))
    return 0
  options = bench.resolve_tiny(plan.options, run_flags.TINY.value)
  results = []
  for w in plan.workloads:
    print(f'{w.name}: {"max-batch search" if options.batch_size is None else "fixed batch"}'
          f'{" (tiny preset)" if options.tiny else ""}', flush=True)
    result = bench.run(w, options, memory, log=lambda line: print(line, flush=True))
    results.append(result)
    if plan.output:
      report.append_jsonl(plan.output, result)
  print()
  print(report.table(results))
  print(report.notes(results))
  return 0 if all(r['status'] in ('ok', 'oom') for r in results) else 1


if __name__ == '__main__':
  try:
    sys.exit(main(sys.argv))
  except KeyboardInterrupt:
    print('jaxbench: interrupted', file=sys.stderr)
    sys.exit(130)
