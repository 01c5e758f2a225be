"""Where a traced window's GPU time went: its kernels summed per step, in the groups of traffic.py.

`--profile_dir` runs one more window of the timed steps under jax.profiler.trace. The trace
holds each kernel the GPU ran, on the line of its stream, with the HLO instruction it ran for
(the `hlo_op` stat XLA's annotations give it). Joined with the compiled program's kernels
(traffic.kernels), each kernel's time falls in the same rows as the bytes
`python -m jaxbench.step_traffic` counts: by kind (a fusion's kind and name, a library call's
target) and by the JAX operation it came from. Time and bytes side by side say which groups run
near the GPU's memory bandwidth and which do not.

Kernels that no instruction of the step names (a copy the profiler makes, another program's)
are counted apart, as OTHER. A trace without a GPU's kernels (a CPU run) gives an empty summary.
"""

import collections
import dataclasses
import glob
import os
from typing import Any

from jaxbench.core import traffic

OTHER = '(not the step)'
TOP = 8  # rows kept of each grouping
BY = ('kind', 'op')  # the groupings, traffic.key's


@dataclasses.dataclass(frozen=True)
class Event:
  """One kernel run on a GPU stream: its name, the HLO instruction it ran for ('' if none)."""

  name: str
  hlo_op: str
  ns: float


def trace_file(profile_dir: str) -> str | None:
  """The newest XSpace file jax.profiler.trace wrote under `profile_dir`, None if none."""
  paths = glob.glob(os.path.join(profile_dir, '**', '*.xplane.pb'), recursive=True)
  return max(paths, key=os.path.getmtime) if paths else None


def gpu_kernels(data) -> list[Event]:
  """The kernels on the stream lines of a trace's GPU planes (jax.profiler.ProfileData). The
  planes' other lines (XLA's modules and ops, where a tool has added them) repeat the same time
  and are left out."""
  out = []
  for plane in data.planes:
    if not plane.name.startswith('/device:GPU'):
      continue
    for line in plane.lines:
      if not line.name.startswith('Stream'):
        continue
      for e in line.events:
        stats = dict(e.stats)
        out.append(Event(e.name, str(stats.get('hlo_op', '')), float(e.duration_ns)))
  return out


def read(profile_dir: str) -> list[Event]:
  """The GPU kernels of the newest trace under `profile_dir`; none if it holds no trace."""
  from jax import profiler  # pylint: disable=g-import-not-at-top

  path = trace_file(profile_dir)
  return gpu_kernels(profiler.ProfileData.from_file(path)) if path else []


def of_window(profile_dir: str, hlo_text: str, steps: int) -> dict[str, Any]:
  """summarize() of the newest trace under `profile_dir` against the step's optimized HLO text;
  what went wrong instead, under 'error', if the trace cannot be read or summed: the trace only
  explains the timed figures, and a failure to read it must not lose them."""
  try:
    return summarize(read(profile_dir), traffic.kernels(hlo_text), steps)
  except Exception as e:  # pylint: disable=broad-exception-caught
    return {'steps': steps, 'error': f'{type(e).__name__}: {e}'}


def _rows(ms: collections.Counter, count: collections.Counter, steps: int) -> list[dict]:
  return [
    {'group': key, 'kernels': count[key] // steps, 'ms': round(t / steps / 1e6, 4)}
    for key, t in ms.most_common(TOP)
  ]


def summarize(
  events: list[Event], kernels: list[traffic.Kernel], steps: int, depth: int = 3
) -> dict[str, Any]:
  """Per step of a window of `steps` steps (at least 1): the kernel time in milliseconds and
  the kernels run, summed over the GPUs of the trace, and the TOP largest groups by kind and by
  JAX operation (the first `depth` parts of its name), each with the bytes traffic.py counts for
  the step's kernels of that group."""
  keys = {k.name: {by: traffic.key(k, by, depth) for by in BY} for k in kernels}
  moved = {by: {key: b for key, _, b in traffic.group(kernels, by, depth)} for by in BY}
  ms = {by: collections.Counter() for by in BY}
  count = {by: collections.Counter() for by in BY}
  for e in events:
    for by in BY:
      key = keys[e.hlo_op][by] if e.hlo_op in keys else OTHER
      ms[by][key] += e.ns
      count[by][key] += 1
  total = sum(e.ns for e in events)
  out = {
    'steps': steps,
    'kernel_ms_per_step': round(total / steps / 1e6, 4),
    'kernels_per_step': len(events) // steps,
  }
  for by in BY:
    rows = _rows(ms[by], count[by], steps)
    for row in rows:
      if row['group'] in moved[by]:
        row['bytes'] = moved[by][row['group']]
    out[f'by_{by}'] = rows
  return out


def lines(name: str, s: dict[str, Any]) -> list[str]:
  """The summary as a run prints it: the total, then the largest groups by kind and by op with
  their share of the time and the rate at which they moved their bytes."""
  if 'error' in s:
    return [f'  {name}: the trace could not be summed: {s["error"]}']
  if not s['kernels_per_step']:
    return [f'  {name}: the trace holds no GPU kernels']
  total = s['kernel_ms_per_step']
  out = [
    f'  {name}: the traced window, per step: {total:.2f} ms of GPU kernels, '
    f'{s["kernels_per_step"]} kernels'
  ]
  for by in BY:
    out.append(f'    by {by}:')
    for row in s[f'by_{by}']:
      rate = ''
      if row.get('bytes') and row['ms'] > 0:
        rate = f'  {row["bytes"] / (row["ms"] / 1e3) / 1e12:5.2f} TB/s'
      share = 100 * row['ms'] / total if total else 0.0
      out.append(
        f'    {row["ms"]:9.3f} ms {share:5.1f}% {row["kernels"]:5d} x{rate}  {row["group"]}'
      )
  return out
