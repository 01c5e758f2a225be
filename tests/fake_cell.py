"""A stand-in for `python -m jaxbench.main` in sweep tests: writes fake results, or misbehaves.

FAKE_SLEEP (seconds per result), FAKE_CRASH (a workload that dies before writing), FAKE_HANG
(a workload that never ends, after one trial in its --progress_file; a SIGINT makes it write that
as its result, status 'interrupted', as jaxbench does). Like jaxbench, it reads its
--search_hints through the store's reader (hints.load); each result says what they forecast
(`hint_peaks`), so a test sees which earlier trials aimed it.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxbench.cards import catalog, emulation  # noqa: E402
from jaxbench.core import hints  # noqa: E402
from jaxbench.results import records as report  # noqa: E402


def main(argv):
  args = dict(a[2:].split('=', 1) for a in argv if '=' in a)
  sets = [a[len('--set=') :].split('=', 1) for a in argv if a.startswith('--set=')]
  gpus = args['gpus'].split(',') if '--predict' in argv else [args['gpu']]
  if os.environ.get('FAKE_CRASH') == args['model']:
    print('Traceback: the fake cell crashed', flush=True)
    os.abort()
  head = {
    'workload': args['model'],
    'precision': args['precision'],
    'tiny': '--tiny' in argv,
    'workload_revision': int(args.get('fake_revision', 1)),
  }
  paths = [p for p in args.get('search_hints', '').split(',') if p]
  hint_peaks = {str(n): peak for n, peak in sorted(hints.load(paths, head)[0].items())}
  if os.environ.get('FAKE_HANG') == args['model']:
    if 'progress_file' in args:  # as jaxbench keeps its result so far: one trial, then stuck
      so_far = {
        'schema': 'jaxbench.result/1',
        'workload': args['model'],
        'precision': args['precision'],
        'tiny': '--tiny' in argv,
        'status': 'interrupted',
        'error': 'ended without its result, while searching: compiling batch 16 sequences',
        'search': {'trials': [{'examples': 8, 'outcome': 'fits', 'predicted_peak_bytes': 1000}]},
        'max_examples': 8,
        'max_batch': 8,
        'workload_revision': int(args.get('fake_revision', 1)),
      }
      emulation.annotate(so_far, catalog.get(gpus[0]), tuple(map(tuple, sets)), 'run')
      report.replace_json(args['progress_file'], so_far)
    try:
      time.sleep(3600)
    except KeyboardInterrupt:
      if 'progress_file' in args:
        report.append_jsonl(args['output'], so_far)
        report.discard(args['progress_file'])
      return 130
  for gpu in gpus:
    time.sleep(float(os.environ.get('FAKE_SLEEP', '0')))
    result = {
      'schema': 'jaxbench.result/1',
      'workload': args['model'],
      'unit': 'sequences',
      'throughput_unit': 'sequences/s',
      'precision': args['precision'],
      'tiny': '--tiny' in argv,
      'status': 'ok',
      'max_batch': 8,
      'max_examples': 8,
      'measurement': {'units_per_s': 100.0},
      'pid': os.getpid(),
      'hint_peaks': hint_peaks,
      'workload_revision': int(args.get('fake_revision', 1)),
    }
    emulation.annotate(
      result, catalog.get(gpu), tuple(map(tuple, sets)), 'predict' if '--predict' in argv else 'run'
    )
    report.append_jsonl(args['output'], result)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
