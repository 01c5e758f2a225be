"""The report command: a sweep's store as the 2020 tables, beside the published figures.

python -m jaxbench.report_main --store=sweep.jsonl --out=docs/results/sweep

--store may name several result files, comma-separated (a sweep's store, the --output of single
emulated runs, a file of --compile_for predictions): they are read in order, so where two give
the same cell the later file's result wins.
"""

import functools
import os

from absl import app, flags

from flags import report as report_flags
from flags import store as store_flags
from jaxbench import cli
from jaxbench.results import store

flags.adopt_module_key_flags(report_flags)  # what --helpshort lists, with --store:
flags.declare_key_flag('store')


_fail = functools.partial(cli.fail, 'jaxbench.report')


def write(store_paths: str | list[str], out_dir: str, reference: str) -> list[str]:
  """Render the store(s) into out_dir (jaxbench.results.render.write); the paths written."""
  from jaxbench.results import render  # pylint: disable=g-import-not-at-top

  return render.write(store_paths, out_dir, reference)


def unwritable_dir(path: str) -> str | None:
  """Why the report cannot be written in the directory `path` (made if missing), or None."""
  if os.path.exists(path) and not os.path.isdir(path):
    return f'{path} is a file, not a directory'
  existing = os.path.abspath(path)
  while not os.path.exists(existing):  # the directories render.write makes
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    return f'{existing} is a file, not a directory'
  return cli.unwritable_dir(existing)


def main(argv: list[str]) -> int:
  del argv  # cli.flags_parser refuses arguments that are not flags
  from jaxbench.cards import catalog  # pylint: disable=g-import-not-at-top

  store_paths = [p for p in (store_flags.STORE.value or '').split(',') if p]
  out_dir, reference = report_flags.OUT.value, report_flags.REFERENCE_GPU.value
  if not store_paths or not out_dir:
    _fail('give --store=FILE[,FILE...] (a sweep\'s JSON Lines) and --out=DIR')
  for path in store_paths:
    problem = store.not_a_store(path)  # no file, or empty, or no line of it a result
    if problem:
      _fail(f'--store: {problem}')
  try:
    catalog.get(reference)
  except catalog.CatalogError as e:
    _fail(f'--reference_gpu: {e}')
  problem = unwritable_dir(out_dir)
  if problem:
    _fail(f'--out: {problem}')
  for path in write(store_paths, out_dir, reference):
    print(path)
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser('jaxbench.report'))
