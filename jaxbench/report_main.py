"""The report command: a sweep's store as the 2020 tables, beside the published figures.

python -m jaxbench.report_main --store=sweep.jsonl --out=docs/results/sweep
"""

import os
import sys

from absl import flags

from flags import report as report_flags
from flags import sweep as sweep_flags

FLAGS = flags.FLAGS
ORDER = ('max_batch', 'throughput', 'normalized', 'summary', 'prediction')


def _fail(message: str) -> None:
  print(f'jaxbench.report: error: {message}', file=sys.stderr)
  sys.exit(2)


def write(store_path: str, out_dir: str, reference: str) -> list[str]:
  """Render the store into out_dir: report.md, one CSV per table, PNG charts; the paths."""
  from jaxbench import published, render, store, tables  # pylint: disable=g-import-not-at-top

  records, warning = store.read(store_path)
  if warning:
    print(warning, file=sys.stderr)
  data = tables.collect(records)
  built = render.build_tables(data, reference)
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  for name in ORDER:
    paths.append(os.path.join(out_dir, f'{name}.csv'))
    with open(paths[-1], 'w') as f:
      f.write(built[name].csv())
  pngs = render.charts(data, reference, out_dir)
  md = [
    f'# jaxbench sweep: {os.path.basename(store_path)}',
    '',
    f'{len(data.records)} results; published figures: {published.SOURCE}.',
    '',
  ]
  md += [built[name].markdown() + '\n' for name in ORDER]
  md += [f'![{os.path.basename(p)}]({os.path.basename(p)})' for p in pngs]
  paths.append(os.path.join(out_dir, 'report.md'))
  with open(paths[-1], 'w') as f:
    f.write('\n'.join(md) + '\n')
  return paths + pngs


def main(argv: list[str]) -> int:
  try:
    extra = FLAGS(argv)[1:]
  except flags.Error as e:
    _fail(str(e).splitlines()[0])
  from jaxbench import catalog  # pylint: disable=g-import-not-at-top

  store_path, out_dir = sweep_flags.STORE.value, report_flags.OUT.value
  if extra:
    _fail(f'unexpected arguments: {" ".join(extra)}')
  if not store_path or not out_dir:
    _fail('give --store=FILE (a sweep\'s JSON Lines) and --out=DIR')
  if not os.path.isfile(store_path):
    _fail(f'--store: no file {store_path}')
  try:
    catalog.get(report_flags.REFERENCE_GPU.value)
  except catalog.CatalogError as e:
    _fail(f'--reference_gpu: {e}')
  for path in write(store_path, out_dir, report_flags.REFERENCE_GPU.value):
    print(path)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
