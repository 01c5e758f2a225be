"""Deviceless forecasts against the GPU's own, at the same batch: how far --compile_for is off.

  python3 scripts/forecast_error.py DEVICELESS.jsonl[,...] ONDEVICE.jsonl[,...]

Every search trial holds XLA's compile-time peak forecast at one batch. A deviceless trial
(compiled for the GPU on a host without one: no autotuning) and a trial compiled on the GPU
itself match when they are the same program: workload and revision, precision, preset,
overrides, configuration, JAX version, XLA flags and device kind, at the same batch. The
memory cap does not change the program (jaxbench/hints.py), so trials of any search match.
Prints one Markdown row per matched batch and, per workload, the largest gap.
"""

import json
import sys

_SAME = ('workload', 'precision', 'tiny', 'jax_version', 'xla_flags')


def _identity(r: dict) -> str:
  fields = {k: r.get(k) for k in _SAME}
  fields['revision'] = r.get('workload_revision', 1)
  fields['overrides'] = r.get('overrides') or []
  fields['config'] = r.get('config')
  fields['kind'] = (r.get('device') or {}).get('kind')
  return json.dumps(fields, sort_keys=True, default=str)


def _peaks(paths: list[str], deviceless: bool) -> dict[tuple[str, int], int]:
  """(identity, batch) -> predicted peak bytes over the trials of the matching records."""
  out = {}
  for path in paths:
    with open(path) as f:
      for line in f:
        try:
          r = json.loads(line)
        except json.JSONDecodeError:
          continue
        if bool((r.get('device') or {}).get('deviceless')) != deviceless:
          continue
        for t in (r.get('search') or {}).get('trials') or []:
          if t.get('predicted_peak_bytes'):
            out[(_identity(r), int(t['examples']))] = int(t['predicted_peak_bytes'])
  return out


def main(argv: list[str]) -> int:
  if len(argv) != 3:
    print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
    return 2
  deviceless = _peaks(argv[1].split(','), True)
  on_device = _peaks(argv[2].split(','), False)
  rows, worst = [], {}
  for key in sorted(
    set(deviceless) & set(on_device), key=lambda k: (json.loads(k[0])['workload'], k[1])
  ):
    ident, n = json.loads(key[0]), key[1]
    a, b = deviceless[key], on_device[key]
    gap = (a - b) / b
    name = f"{ident['workload']} {ident['precision']}"
    rows.append(
      f'| {name} | {n:,} | {b / 1e9:.3f} | {a / 1e9:.3f} '
      f'| {(a - b) / 1e6:+,.0f} | {100 * gap:+.2f}% |'
    )
    if name not in worst or abs(gap) > abs(worst[name][1]):
      worst[name] = (n, gap)
  print('| workload | batch | on the GPU, GB | deviceless, GB | deviceless - GPU, MB | gap |')
  print('|---|---|---|---|---|---|')
  print('\n'.join(rows))
  print()
  for name, (n, gap) in sorted(worst.items()):
    print(f'- {name}: largest gap {100 * gap:+.2f}% (at {n:,})')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
