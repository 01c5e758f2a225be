"""The report command: a sweep's store as the 2020 tables, beside the published figures.

python -m jaxbench.report_main --store=sweep.jsonl --out=docs/results/sweep

--store may name several result files, comma-separated (a sweep's store, the --output of single
emulated runs, a file of --compile_for predictions): they are read in order, so where two give
the same cell the later file's result wins.
"""

import os
import sys

from absl import flags

from flags import report as report_flags
from flags import sweep as sweep_flags

FLAGS = flags.FLAGS


def _fail(message: str) -> None:
  print(f'jaxbench.report: error: {message}', file=sys.stderr)
  sys.exit(2)


def write(store_paths: str | list[str], out_dir: str, reference: str) -> list[str]:
  """Render the store(s) into out_dir (jaxbench.results.render.write); the paths written."""
  from jaxbench.results import render  # pylint: disable=g-import-not-at-top

  return render.write(store_paths, out_dir, reference)


def main(argv: list[str]) -> int:
  try:
    extra = FLAGS(argv)[1:]
  except flags.Error as e:
    _fail(str(e).splitlines()[0])
  from jaxbench.cards import catalog  # pylint: disable=g-import-not-at-top

  store_paths = [p for p in (sweep_flags.STORE.value or '').split(',') if p]
  out_dir = report_flags.OUT.value
  if extra:
    _fail(f'unexpected arguments: {" ".join(extra)}')
  if not store_paths or not out_dir:
    _fail('give --store=FILE[,FILE...] (a sweep\'s JSON Lines) and --out=DIR')
  for path in store_paths:
    if not os.path.isfile(path):
      _fail(f'--store: no file {path}')
  try:
    catalog.get(report_flags.REFERENCE_GPU.value)
  except catalog.CatalogError as e:
    _fail(f'--reference_gpu: {e}')
  for path in write(store_paths, out_dir, report_flags.REFERENCE_GPU.value):
    print(path)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
