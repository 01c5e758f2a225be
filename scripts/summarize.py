"""Results (JSON lines) as the Markdown rows and search chains of docs/results/, copied not retyped.

  python3 scripts/summarize.py docs/results/2026-11-30-h200-runs.jsonl [...]

One table row per result with status ok, then each result's search as printed:
"n fits P GB (compile s) -> n predicted P GB (compile s) -> ...". Batches are in the
workload's unit; memory is "full" or the --memory_limit_gb cap; an emulated card is named.
"""

import json
import sys

HEADER = (
  '| workload | precision | memory | max batch | throughput | step ms (spread) | TFLOP/s '
  '| peak predicted / allocator | compiles / search time | tolerance |\n'
  '|---|---|---|---|---|---|---|---|---|---|'
)


def _gb(n: int | None) -> str:
  return '—' if n is None else f'{n / 1e9:.2f}'


def autotune_level(r: dict) -> int | None:
  """--autotune_level as the run's XLA_FLAGS set it (jaxbench.report.autotune_level's reading;
  this script imports nothing of jaxbench, so that it runs on the device's bare python3)."""
  flags = [
    f for f in (r.get('xla_flags') or '').split() if f.startswith('--xla_gpu_autotune_level=')
  ]
  return int(flags[-1].split('=', 1)[1]) if flags else None


def workload(r: dict) -> str:
  """The workload's name, with its --set overrides and --autotune_level where a run had any."""
  sets = ', '.join(f'{k}={v}' for k, v in r.get('overrides') or [])
  level = autotune_level(r)
  if level is not None:
    sets = ', '.join(x for x in (sets, f'autotune level {level}') if x)
  return f"{r['workload']} ({sets})" if sets else r['workload']


def memory(r: dict) -> str:
  if r.get('emulation'):
    how = 'predicted' if r.get('mode') == 'predict' else 'emulated'
    return f"{r['emulation']['display']} ({how})"
  limit = (r.get('memory') or {}).get('limit_bytes')
  return 'full' if limit is None else f'{limit / 1e9:g} GB'


def row(r: dict) -> str | None:
  m = r.get('measurement')
  if r.get('status') != 'ok' or not m or m.get('units_per_s') is None:
    return None  # interrupted, invalid or failed: its chain below says what it got
  search = r.get('search') or {}
  trials = search.get('trials') or []
  if search.get('mode') == 'fixed':
    how = f"{len(trials)} (fixed batch)"
  else:
    how = f"{search.get('compiles', len(trials))} / {search.get('seconds') or 0:.0f} s"
    if search.get('cache_loads'):
      how += f" (+{search['cache_loads']} from the cache)"
    earlier = sum(1 for t in trials if t.get('earlier'))
    if earlier:
      how += f' (+{earlier} trials of earlier runs)'
  tol = search.get('tolerance') or 0
  return (
    f"| {workload(r)} | {r['precision']} | {memory(r)} | {r['max_batch']:,} {r['unit']} "
    f"| {m['units_per_s']:,.1f} {r['throughput_unit']} "
    f"| {m['median_step_s'] * 1e3:,.1f} ({m['spread_pct']:.1f}%) | {m['tflops_per_s']:.1f} "
    f"| {_gb(m.get('predicted_peak_bytes'))} / {_gb(m.get('process_peak_bytes'))} GB "
    f"| {how} | {'exact' if not tol else f'{tol:.0%}'} |"
  )


def chain(r: dict) -> str:
  steps = []
  for t in (r.get('search') or {}).get('trials') or []:
    what = 'fits' if t['outcome'] == 'fits' else t['outcome'].replace('oom_', 'OOM ')
    if t['outcome'] == 'oom_predicted':
      what = 'predicted'
    peak = f" {_gb(t.get('predicted_peak_bytes'))} GB" if t.get('predicted_peak_bytes') else ''
    compile_s = f" ({t['compile_s']:.1f} s)" if t.get('compile_s') is not None else ''
    if t.get('cached'):
      compile_s = f" (cache {t['compile_s']:.1f} s)"
    earlier = f" [run of {t['earlier']}]" if t.get('earlier') else ''  # --search_resume
    if t.get('autotune_level') is not None:  # --probe_autotune_level: a compile-only probe
      earlier += f" [autotune level {t['autotune_level']}]"
    steps.append(f"{t['batch']:,} {what}{peak}{compile_s}{earlier}")
  head = f"{workload(r)} {r['precision']}, {memory(r)} [{r['status']}]"
  error = f" ({r['error']})" if r.get('error') else ''
  return f"{head}: {' → '.join(steps) or 'no trials'}{error}"


def main(paths: list[str]) -> None:
  records = [json.loads(line) for p in paths for line in open(p) if line.strip()]
  print(HEADER)
  for r in records:
    line = row(r)
    if line:
      print(line)
  print()
  for r in records:
    print(f'- {chain(r)}')


if __name__ == '__main__':
  main(sys.argv[1:])
