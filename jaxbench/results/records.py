"""Results as a short table for people and as JSON Lines for programs."""

import json
import os
from typing import Any, Iterable

from jaxbench.results import store

COLUMNS = (
  'workload',
  'precision',
  'device',
  'devices',
  'max batch',
  'steps/s',
  'throughput',
  'step ms (spread)',
  'peak memory',
  'compile s',
  'TFLOP/s',
  'status',
)


def _fmt(value, spec, missing='-'):
  return missing if value is None else format(value, spec)


def autotune_level(result: dict[str, Any]) -> int | None:
  """The --xla_gpu_autotune_level a result's XLA_FLAGS set (--autotune_level), or None: XLA's
  default (4). A run at another level times other convolution algorithms than the default's."""
  level = None
  for flag in (result.get('xla_flags') or '').split():
    if flag.startswith('--xla_gpu_autotune_level='):
      level = int(flag.split('=', 1)[1])
  return level


# The XLA flags jaxbench sets itself from its own flags (jaxbench/core/backend.py), by prefix.
_OWN_XLA_FLAGS = (
  '--xla_gpu_memory_limit_slop_factor=',
  '--xla_gpu_enable_triton_gemm=false',
  '--xla_gpu_autotune_level=',
  '--xla_gpu_per_fusion_autotune_cache_dir=',
  '--xla_gpu_dump_autotune_logs_to=',
  '--xla_disable_hlo_passes=rematerialization',
)


def user_xla_flags(result: dict[str, Any]) -> list[str]:
  """The XLA flags a run had from its environment's XLA_FLAGS rather than from jaxbench's own
  flags (--triton_gemm, --autotune_level, --remat, ...), in their order."""
  flags = (result.get('xla_flags') or '').split()
  return [f for f in flags if not f.startswith(_OWN_XLA_FLAGS)]


def prng_impl(result: dict[str, Any]) -> str:
  """The JAX PRNG implementation that drew a run's dropout and synthetic batch
  (JAX_DEFAULT_PRNG_IMPL); a record from before the field was JAX's default, threefry2x32."""
  return result.get('prng_impl') or 'threefry2x32'


def compiler(result: dict[str, Any]) -> str:
  """A JAX run's compiler and PRNG settings away from jaxbench's defaults, as the command gives
  them ('' for none, and for a PyTorch run): another autotuning level, Triton GEMMs, XLA flags
  of the run's own, another PRNG. Each makes another program or another tuning of it."""
  if framework(result) != 'jax':
    return ''
  flags = result.get('xla_flags')
  parts = [] if autotune_level(result) is None else [f'--autotune_level={autotune_level(result)}']
  if flags is not None and '--xla_gpu_enable_triton_gemm=false' not in flags.split():
    parts.append('--triton_gemm')
  return ' '.join(parts + environment(result))


def environment(result: dict[str, Any]) -> list[str]:
  """The environment variables a JAX run had that changed its program: XLA flags of its own
  and another PRNG than JAX's default, as a command line would set them."""
  if framework(result) != 'jax':
    return []
  env = ["XLA_FLAGS='" + ' '.join(user_xla_flags(result)) + "'"] if user_xla_flags(result) else []
  if prng_impl(result) != 'threefry2x32':
    env.append(f'JAX_DEFAULT_PRNG_IMPL={prng_impl(result)}')
  return env


def human_bytes(n: int | None) -> str:
  if n is None:
    return '-'
  return f'{n / 1e9:.2f} GB' if n >= 1e8 else f'{n / 1e6:.2f} MB'


def devices(result: dict[str, Any]) -> str:
  """The devices a run trained on (data-parallel, its max batch per device), and its scaling
  efficiency where one device was timed too: '4 (93% scaling)'."""
  par = result.get('parallel') or {}
  eff = (par.get('scaling') or {}).get('efficiency')
  return f"{par.get('global_devices', 1)}" + ('' if eff is None else f' ({eff:.0%} scaling)')


def row(result: dict[str, Any]) -> tuple[str, ...]:
  m = result.get('measurement') or {}
  dev = result['device']
  device = dev['kind'] if dev['platform'] == 'gpu' else f"{dev['platform'].upper()} ({dev['kind']})"
  batch = f"{result.get('max_batch', 0)} {result['unit']}"
  if result['search']['mode'] == 'fixed':
    batch += ' (fixed)'
  units = m.get('units_per_s')
  throughput = '-' if units is None else f"{units:,.1f} {result['throughput_unit']}"
  step = m.get('median_step_s')
  step_txt = '-' if step is None else f"{1e3 * step:.2f} (±{m['spread_pct'] / 2:.1f}%)"
  peak = m.get('predicted_peak_bytes')
  if framework(result) != 'jax':  # PyTorch has no forecast: the allocator's peak
    peak = m.get('process_peak_bytes')
  status = result['status'] if not result.get('error') else f"{result['status']}: {result['error']}"
  return (
    result['workload'],
    result['precision'],
    device,
    devices(result),
    batch,
    _fmt(m.get('steps_per_s'), '.3f'),
    throughput,
    step_txt,
    human_bytes(peak),
    _fmt(m.get('compile_s'), '.1f'),
    _fmt(m.get('tflops_per_s'), '.1f'),
    status[:80],
  )


def framework(result: dict[str, Any]) -> str:
  """'jax' or 'pytorch' (results from before the field are JAX's)."""
  return result.get('framework') or 'jax'


FRAMEWORK_NAMES = {'jax': 'JAX', 'pytorch': 'PyTorch'}


def table(results: Iterable[dict[str, Any]]) -> str:
  """The printed table; with a framework column where any result is not JAX's."""
  results = list(results)
  header, rows = COLUMNS, [row(r) for r in results]
  if any(framework(r) != 'jax' for r in results):
    shown = [
      FRAMEWORK_NAMES[framework(r)] + (' compiled' if r.get('torch_compile') else '')
      for r in results
    ]
    header = (*COLUMNS[:2], 'framework', *COLUMNS[2:])
    rows = [(*x[:2], f, *x[2:]) for x, f in zip(rows, shown)]
  return _aligned([header, *rows])


def _aligned(rows: list[tuple[str, ...]]) -> str:
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
  lines.insert(1, '  '.join('-' * w for w in widths))
  return '\n'.join(lines)


def _ratio(a: float | None, b: float | None) -> str:
  return '-' if not a or not b else f'{a / b:.2f}x'


def _pytorch_mode(result: dict[str, Any]) -> str:
  return 'compiled' if result.get('torch_compile') else 'eager'


def side_by_side(results: Iterable[dict[str, Any]]) -> str:
  """JAX and PyTorch results of the same workload and precision on one row: the device, each
  side's max batch and throughput, and the ratios JAX over PyTorch ('-' where either is missing).

  PyTorch eager and compiled (--torch_compile) results get a column each, and the ratios are
  JAX over the better of them, the comparison that matters: the best PyTorch offers; the compile
  column holds the compiled side's first-step compile time.
  """
  results = list(results)
  rows_by: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
  for r in results:
    key = 'jax' if framework(r) == 'jax' else _pytorch_mode(r)
    rows_by.setdefault((r['workload'], r['precision']), {})[key] = r
  torch_runs = [r for r in results if framework(r) != 'jax']
  modes = [m for m in ('eager', 'compiled') if any(_pytorch_mode(r) == m for r in torch_runs)]
  labels = {m: 'PyTorch' + (f' {m}' if 'compiled' in modes else '') for m in modes or ['eager']}
  modes = list(labels)

  def ok(r):
    return r is not None and r['status'] == 'ok'

  def batch(r):
    if r is None:
      return '-'
    text = f"{r.get('max_batch', 0)} {r['unit']}"
    return text if r['status'] == 'ok' else f"{text} ({r['status']})"

  def rate(r):
    return ((r or {}).get('measurement') or {}).get('units_per_s')

  def rate_text(r):
    units = rate(r)
    return '-' if units is None else f"{units:,.1f} {r['throughput_unit']}"

  def best(values):
    values = [v for v in values if v]
    return max(values) if values else None

  def device(by):
    r = by.get('jax') or next(iter(by.values()))
    dev = r.get('device') or {}
    if dev.get('platform') == 'gpu':
      return dev.get('kind', 'gpu')
    return f"{dev.get('platform', '?').upper()} ({dev.get('kind', '?')})"

  compiled = 'compiled' in modes
  header = (
    'workload',
    'precision',
    'device',
    'max batch JAX',
    *(f'max batch {labels[m]}' for m in modes),
    'ratio',
    'throughput JAX',
    *(f'throughput {labels[m]}' for m in modes),
    'ratio',
    *(('compile s PyTorch',) if compiled else ()),
  )
  rows = []
  for (name, precision), by in rows_by.items():
    j, torch_by = by.get('jax'), [by.get(m) for m in modes]
    fits = best(t.get('max_batch') for t in torch_by if ok(t))
    compile_s = ((by.get('compiled') or {}).get('measurement') or {}).get('compile_s')
    rows.append(
      (
        name,
        precision,
        device(by),
        batch(j),
        *(batch(t) for t in torch_by),
        _ratio(j.get('max_batch'), fits) if ok(j) else '-',
        rate_text(j),
        *(rate_text(t) for t in torch_by),
        _ratio(rate(j), best(rate(t) for t in torch_by)),
        *((_fmt(compile_s, '.1f'),) if compiled else ()),
      )
    )
  return _aligned([header, *rows])


def json_line(result: dict[str, Any]) -> str:
  """One result as the one line of JSON Lines that stores it, without the newline."""
  return json.dumps(result, sort_keys=True, default=str)


def open_append(path: str) -> int:
  """The file descriptor of `path` opened for append_jsonl's writes, created if new."""
  return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def write_jsonl(fd: int, result: dict[str, Any], path: str = '') -> None:
  """Append one result as one line to the file `fd` (open_append), in a single write, flushed
  to disk.

  One os.write of a whole line on a file opened with O_APPEND lands whole or
  not at all, so a reader never sees half a result, even if we are killed.
  """
  line = (json_line(result) + '\n').encode()
  written = os.write(fd, line)
  if written != len(line):
    raise OSError(f'short write to {path or "the output"}: {written} of {len(line)} bytes')
  os.fsync(fd)


def append_jsonl(path: str, result: dict[str, Any]) -> None:
  """Append one result to `path` as one line (write_jsonl)."""
  fd = open_append(path)
  try:
    write_jsonl(fd, result, path)
  finally:
    os.close(fd)


def replace_json(path: str, record: dict[str, Any]) -> None:
  """Write one record as the whole of `path`, replacing what was there in one rename, so the
  file holds the old record or the new one, never part of either, even if we are killed."""
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(json.dumps(record, sort_keys=True, default=str) + '\n')
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any] | None:
  """The record replace_json wrote to `path`, or None if there is none."""
  try:
    with open(path) as f:
      return json.loads(f.read())
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def discard(path: str | None) -> None:
  """Remove `path` if it exists."""
  if path:
    try:
      os.remove(path)
    except FileNotFoundError:
      pass


def notes(results: Iterable[dict[str, Any]]) -> str:
  """Plain-language notes under the table: where it ran and how memory was bounded."""
  out = []
  for r in results:
    dev, mem = r['device'], r['memory']
    if dev['platform'] != 'gpu':
      out.append(
        f"{r['workload']}: ran on the {dev['platform'].upper()}, not a GPU"
        f"{' (tiny preset)' if r['tiny'] else ''}; figures are not comparable with GPU runs."
      )
    limit = mem['limit_bytes']
    budget = mem['budget_bytes']
    if not limit:
      memory = 'full device'
    else:
      memory = f'limit {limit / 1e9:.1f} GB' if limit >= 1e8 else f'limit {human_bytes(limit)}'
    out.append(
      f"{r['workload']}: memory {memory}"
      f", budget {human_bytes(budget)}"
      f" enforced by {mem['enforced_by']}"
      + (
        f"; XLA rematerialization {'on' if mem['remat'] else 'off'}"
        if framework(r) == 'jax'
        else f"; PyTorch{' under torch.compile' if r.get('torch_compile') else ', eager'}"
      )
      + ('' if autotune_level(r) is None else f'; XLA autotuning at level {autotune_level(r)}')
      + f"; {'max-batch search' if r['search']['mode'] == 'search' else 'fixed batch'},"
      f" {len(r['search']['trials'])} trials"
      + ('' if r['search'].get('seconds') is None else f", {r['search']['seconds']:.1f} s")
      + _initial_state(r)
      + '.'
    )
    if store.lower_bound(r):
      out.append(
        f"{r['workload']}: every batch up to --max_examples fitted; {r['max_batch']} {r['unit']}"
        ' is a lower bound, not the max.'
      )
    if r['status'] == 'interrupted':
      out.append(
        f"{r['workload']}: {r['error']}; the largest batch that ran: {r['max_batch']} {r['unit']}."
      )
  return '\n'.join(out)


def _initial_state(r: dict[str, Any]) -> str:
  """The note's words on the initial state: its seconds, and whether its program was loaded
  from the init cache (jaxbench/core/init_cache.py)."""
  if r.get('init_s') is None:
    return ''
  kept = ', its program loaded from the cache' if r.get('init_cached') else ''
  return f" (initial state built in {r['init_s']:.1f} s{kept})"
