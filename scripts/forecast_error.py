"""Deviceless forecasts against the GPU's own, at the same batch: how far --compile_for is off.

  python3 scripts/forecast_error.py DEVICELESS.jsonl[,...] ONDEVICE.jsonl[,...]

Matches every search trial of the deviceless results with the on-device trials of the same
program at the same batch (jaxbench/forecast.py says what "the same program" takes). Prints one
Markdown row per matched batch and, per workload, the largest gap. A report
(python -m jaxbench.report_main) whose store holds both kinds has the per-workload summary.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxbench import forecast, store  # noqa: E402


def _read(paths: str) -> list[dict]:
  return [r for path in paths.split(',') for r in store.read(path)[0]]


def main(argv: list[str]) -> int:
  if len(argv) != 3:
    print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
    return 2
  found = forecast.gaps(_read(argv[1]), _read(argv[2]))
  print('| workload | batch | on the GPU, GB | deviceless, GB | deviceless - GPU, MB | gap |')
  print('|---|---|---|---|---|---|')
  for g in found:
    print(
      f'| {g.name} | {g.examples:,} | {g.on_device / 1e9:.3f} | {g.deviceless / 1e9:.3f} '
      f'| {(g.deviceless - g.on_device) / 1e6:+,.0f} | {100 * g.relative:+.2f}% |'
    )
  print()
  for name, g in sorted(forecast.largest(found).items()):
    print(f'- {name}: largest gap {100 * g.relative:+.2f}% (at {g.examples:,})')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
