"""Command-line validation: every bad input becomes one UsageError line, before any work."""

import dataclasses
import os

from jaxbench.core import bench
from models import precision, registry
from models import workload as wl


class UsageError(Exception):
  """Bad input: main prints it as one line and exits with status 2."""


@dataclasses.dataclass(frozen=True)
class Plan:
  action: str  # 'list', 'describe', 'check' or 'run'
  workloads: tuple[wl.Workload, ...]
  options: bench.Options
  memory_limit_gb: float | None = None
  remat: bool = False
  output: str | None = None
  compilation_cache_dir: str | None = None
  triton_gemm: bool = False
  progress_file: str | None = None


def parse_overrides(items: list[str]) -> tuple[tuple[str, str], ...]:
  pairs = []
  for item in items:
    key, sep, value = item.partition('=')
    if not sep or not key:
      raise UsageError(f'--set expects KEY=VALUE, got {item!r}')
    pairs.append((key.strip(), value.strip()))
  return tuple(pairs)


def resolve_models(names: list[str]) -> tuple[wl.Workload, ...]:
  if names == ['all']:
    return tuple(registry.all_workloads())
  try:
    return tuple(registry.get(n) for n in dict.fromkeys(names))
  except KeyError as e:
    raise UsageError(e.args[0]) from None


def plan(f) -> Plan:
  """Check the parsed flags (an object with the flag values as attributes)."""
  if getattr(f, 'check', False) and (f.describe or f.list_models):
    raise UsageError('--check validates a run: not with --describe or --list_models')
  if f.list_models and (f.describe or f.model):
    raise UsageError('--list_models takes no --model or --describe')
  if f.list_models:
    return Plan('list', tuple(registry.all_workloads()), bench.Options())
  if not f.model and not f.describe:
    raise UsageError(
      'choose a workload with --model=NAME (or --model=all); --list_models lists them'
    )
  workloads = resolve_models(f.model) if f.model else tuple(registry.all_workloads())
  if f.precision is not None and f.precision not in precision.POLICIES:
    raise UsageError(f'unknown precision {f.precision!r}; valid: {", ".join(precision.POLICIES)}')
  for name, value, least in (
    ('warmup_steps', f.warmup_steps, 0),
    ('steps', f.steps, 1),
    ('windows', f.windows, 1),
    ('max_examples', f.max_examples, 1),
  ):
    if value < least:
      raise UsageError(f'--{name} must be at least {least}, got {value}')
  if not 0 <= f.search_tolerance < 1:
    raise UsageError(f'--search_tolerance must be in [0, 1), got {f.search_tolerance}')
  for path in f.search_hints:
    if not os.path.isfile(path):
      raise UsageError(f'--search_hints: {path} is not a file')
  if getattr(f, 'search_resume', False) and (not f.search_hints or f.batch_size is not None):
    raise UsageError(
      '--search_resume goes on with a search from the results in --search_hints: give those, '
      'and no --batch_size'
    )
  if not getattr(f, 'run_every_fit', True) and f.batch_size is not None:
    raise UsageError('--norun_every_fit is for searches: a fixed --batch_size runs its one batch')
  if not getattr(f, 'run_every_fit', True) and f.verify_predicted_oom:
    raise UsageError(
      '--norun_every_fit decides fits by their forecast, --verify_predicted_oom runs what the '
      'forecast rules out: give one of them'
    )
  probe_level = getattr(f, 'probe_autotune_level', None)
  if probe_level is not None:
    for given, what in (
      (f.batch_size is not None, '--batch_size (a fixed batch has no search)'),
      (getattr(f, 'search_resume', False), '--search_resume (its probes are cheap to redo)'),
      (f.verify_predicted_oom, '--verify_predicted_oom (its probes run nothing)'),
    ):
      if given:
        raise UsageError(f'--probe_autotune_level is for a search: not with {what}')
  if f.steps < f.windows:
    raise UsageError(f'--steps ({f.steps}) must be at least --windows ({f.windows})')
  if f.batch_size is not None and f.batch_size <= 0:
    raise UsageError(f'--batch_size must be positive, got {f.batch_size}')
  if f.memory_limit_gb is not None and f.memory_limit_gb <= 0:
    raise UsageError(f'--memory_limit_gb must be positive, got {f.memory_limit_gb}')
  if f.describe and (f.batch_size is not None or f.output):
    raise UsageError('--describe runs nothing: it takes no --batch_size or --output')
  overrides = parse_overrides(f.set)
  for w in workloads:
    try:
      cfg = w.resolve(tiny=bool(f.tiny), overrides=dict(overrides))
    except ValueError as e:
      raise UsageError(str(e)) from None
    if f.batch_size is not None and f.batch_size < w.example_size(cfg):
      raise UsageError(
        f'--batch_size={f.batch_size} is less than one example of {w.name} '
        f'({w.example_size(cfg)} {w.unit})'
      )
  if f.output:
    parent = os.path.dirname(os.path.abspath(f.output))
    if not os.path.isdir(parent):
      raise UsageError(f'--output: directory {parent} does not exist')
    if os.path.isdir(f.output):
      raise UsageError(f'--output: {f.output} is a directory')
  progress_file = getattr(f, 'progress_file', None)
  if progress_file:
    parent = os.path.dirname(os.path.abspath(progress_file))
    if not os.path.isdir(parent) or os.path.isdir(progress_file):
      raise UsageError(f'--progress_file: {progress_file} is not a file in an existing directory')
    if f.describe:
      raise UsageError('--describe runs nothing: it takes no --progress_file')
    if f.output and os.path.abspath(f.output) == os.path.abspath(progress_file):
      raise UsageError('--progress_file and --output must be different files')
  options = bench.Options(
    precision=f.precision,
    tiny=bool(f.tiny),
    overrides=overrides,
    batch_size=f.batch_size,
    warmup_steps=f.warmup_steps,
    steps=f.steps,
    windows=f.windows,
    seed=f.seed,
    max_examples=f.max_examples,
    verify_predicted_oom=f.verify_predicted_oom,
    search_tolerance=f.search_tolerance,
    search_hints=tuple(f.search_hints),
    search_resume=bool(getattr(f, 'search_resume', False)),
    run_every_fit=bool(getattr(f, 'run_every_fit', True)),
    probe_autotune_level=probe_level,
  )
  return Plan(
    'describe' if f.describe else 'check' if getattr(f, 'check', False) else 'run',
    workloads,
    options,
    f.memory_limit_gb,
    f.remat,
    f.output,
    f.compilation_cache_dir,
    f.triton_gemm,
    progress_file,
  )
