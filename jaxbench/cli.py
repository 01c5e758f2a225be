"""The command line's values, and their validation: every bad input is one UsageError line.

The flag parser has checked each value alone (types, bounds, precision names); this module
checks them together and against the workloads, before any work. It imports JAX and the models
only when `plan` runs, so that the entry point can read the flags before the backend starts.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from absl import flags

if TYPE_CHECKING:
  from jaxbench.core import bench
  from models import workload as wl

# The search stops once the largest fit and the smallest failure are within this fraction of
# the fit (--search_tolerance): one example at any max batch under 400, 0.5% above. Replayed on
# the recorded H200 searches it changes one maximum, transformer_big fp16's at full memory (5,680
# to 5,676 sentence pairs), and saves that search 4 of its 11 compiles, spent where a forecast
# that is not monotone in the batch sends the last probes after noise (docs/performance.md).
SEARCH_TOLERANCE = 0.005


class UsageError(Exception):
  """Bad input: main prints it as one line and exits with status 2."""


def flags_parser(prog: str) -> Callable[[list[str]], list[str]]:
  """absl.app.run's flags_parser for the command `prog`: a bad flag is one line and status 2.

  The line is `prog: error: ...`, on stderr, without absl's usage text. absl's --help,
  --helpshort and --helpfull print the help and exit with status 1; the help asked for is no
  error, so they exit with 0.
  """

  def parse(argv: list[str]) -> list[str]:
    try:
      rest = flags.FLAGS(argv)
    except flags.Error as e:
      fail(prog, str(e).splitlines()[0])
    except SystemExit:  # only absl's help flags exit while parsing, after they printed
      sys.exit(0)
    if rest[1:]:
      fail(prog, f'unexpected arguments: {" ".join(rest[1:])}')
    if flags.FLAGS['verbosity'].using_default_value:
      # Python's logging at WARNING, not absl.app's INFO: what JAX logs at INFO (backends
      # it did not find, ...) is no part of a run's output. --verbosity=0 shows it.
      flags.FLAGS.verbosity = -1
    return rest

  return parse


def fail(prog: str, message: str) -> NoReturn:
  """Bad input of the command `prog`: one line on stderr, and status 2."""
  print(f'{prog}: error: {message}', file=sys.stderr)
  sys.exit(2)


@dataclasses.dataclass(frozen=True)
class Args:
  """The parsed command line as plain values, one field per flag (lists as tuples).

  The defaults are the flags' (tests/test_flags.py checks that they agree).
  """

  # flags/run.py
  model: tuple[str, ...] = ()
  list_models: bool = False
  describe: bool = False
  check: bool = False
  batch_size: int | None = None
  precision: str | None = None
  warmup_steps: int = 3
  steps: int = 20
  windows: int = 5
  seed: int = 0
  tiny: bool | None = None
  set: tuple[str, ...] = ()
  output: str | None = None
  profile_dir: str | None = None
  # flags/search.py
  memory_limit_gb: float | None = None
  # flags/sweep.py
  gpu: str | None = None
  memory_gb: float | None = None
  gpus: tuple[str, ...] = ()
  precisions: tuple[str, ...] = ()
  predict: bool = False
  compile_for: str | None = None
  store: str | None = None
  cell_timeout_s: int = 3600
  retry_failed: bool = False
  # flags/advanced.py
  remat: bool = False
  verify_predicted_oom: bool = False
  search_tolerance: float = SEARCH_TOLERANCE
  search_hints: tuple[str, ...] = ()
  search_resume: bool = False
  run_every_fit: bool = True
  max_examples: int = 1 << 20
  compilation_cache_dir: str | None = None
  autotune_level: int | None = None
  probe_autotune_level: int | None = None
  autotune_cache_dir: str | None = None
  autotune_log: str | None = None
  triton_gemm: bool = False
  progress_file: str | None = None
  # flags/train.py
  train_steps: int | None = None
  checkpoint_dir: str | None = None
  checkpoint_every: int = 100
  checkpoint_keep: int = 3
  log_every: int = 10
  data: str = 'synthetic'
  data_dir: str | None = None
  # flags/pytorch.py
  framework: str = 'jax'
  frameworks: tuple[str, ...] = ()
  torch_compile: bool = False
  reference_batch: bool = False
  # flags/parallel.py
  devices: str = '1'
  shard_optimizer: bool = False
  scaling: bool = False
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None


@dataclasses.dataclass(frozen=True)
class Plan:
  """What to do with which workloads; what runner.run needs besides the options."""

  action: str  # 'list', 'describe', 'check' or 'run'
  workloads: tuple[wl.Workload, ...]
  options: bench.Options
  remat: bool = False
  output: str | None = None
  progress_file: str | None = None
  warnings: tuple[str, ...] = ()  # what is wrong but does not stop the run: one line each
  train: Any = None  # jaxbench.train.options.Train: train instead of timing (--train_steps)
  framework: str = 'jax'  # or 'pytorch': the workload's peer (jaxbench/pytorch)
  torch_compile: bool = False


def print_columns(header: tuple[str, ...], rows: list[tuple], left: int) -> None:
  """A benchmark's table on stdout: a column each, the first `left` aligned left and the others
  right; a short row (a failure's message) fills what it has."""
  lines = [header] + [tuple(map(str, row)) for row in rows]
  widths = [max(len(line[i]) for line in lines if i < len(line)) for i in range(len(header))]
  for line in lines:
    print(
      '  '.join(
        c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))
      )
    )


def parse_overrides(items: tuple[str, ...] | list[str]) -> tuple[tuple[str, str], ...]:
  pairs = []
  for item in items:
    key, sep, value = item.partition('=')
    if not sep or not key:
      raise UsageError(f'--set expects KEY=VALUE, got {item!r}')
    pairs.append((key.strip(), value.strip()))
  return tuple(pairs)


def resolve_models(names: tuple[str, ...] | list[str]) -> tuple[wl.Workload, ...]:
  from models import registry  # pylint: disable=g-import-not-at-top

  if list(names) == ['all']:
    return tuple(registry.all_workloads())
  try:
    return tuple(registry.get(n) for n in dict.fromkeys(names))
  except KeyError as e:
    raise UsageError(e.args[0]) from None


def unwritable(path: str, replaced: bool = False) -> str | None:
  """Why the file `path` cannot be written, in words, or None.

  An existing file is opened for append (it changes nothing); a new one is proven by creating,
  writing and removing a probe beside it, so nothing is left behind. `replaced`: the file is
  rewritten whole by a rename (records.replace_json), which its directory must allow.
  """
  parent = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    return f'{path} is a directory'
  if not os.path.isdir(parent):
    return f'directory {parent} does not exist'
  if os.path.exists(path):
    if not os.path.isfile(path):
      return f'{path} is not a regular file'
    if not replaced:
      try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
      except OSError as e:
        return f'cannot write {path}: {e.strerror}'
      return None
  return unwritable_dir(parent)


def unwritable_dir(directory: str) -> str | None:
  """Why no file can be created in `directory` (a probe written, synced and removed), or None."""
  probe = os.path.join(directory, f'.jaxbench-probe-{os.getpid()}')
  try:
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
  except OSError as e:
    return f'cannot create a file in {directory}: {e.strerror}'
  try:
    os.write(fd, b'\n' * 4096)  # about a result's size: a full disk refuses it
    os.fsync(fd)
  except OSError as e:
    return f'cannot write in {directory}: {e.strerror}'
  finally:
    os.close(fd)
    os.remove(probe)
  return None


def _hints(paths: tuple[str, ...]) -> list[str]:
  """--search_hints: files of results, each readable with at least one result in it; the
  warning lines of those with lines that are not results (the run skips those lines)."""
  from jaxbench.results import store  # pylint: disable=g-import-not-at-top

  warnings = []
  for path in paths:
    try:
      records, warning = store.read(path)
    except (OSError, UnicodeError) as e:
      raise UsageError(f'--search_hints: cannot read {path}: {getattr(e, "strerror", e)}') from None
    if not records and os.path.getsize(path):
      raise UsageError(f'--search_hints: {path} holds no result (a JSON Lines file of results)')
    if warning:
      warnings.append(warning)
  return warnings


def _search_conflicts(a: Args) -> None:
  """The advanced search flags that exclude each other or a fixed batch."""
  for path in a.search_hints:
    if not os.path.isfile(path):
      raise UsageError(f'--search_hints: {path} is not a file')
  if a.search_resume and (not a.search_hints or a.batch_size is not None):
    raise UsageError(
      '--search_resume goes on with a search from the results in --search_hints: give those, '
      'and no --batch_size'
    )
  if not a.run_every_fit and a.batch_size is not None:
    raise UsageError('--norun_every_fit is for searches: a fixed --batch_size runs its one batch')
  if not a.run_every_fit and a.verify_predicted_oom:
    raise UsageError(
      '--norun_every_fit decides fits by their forecast, --verify_predicted_oom runs what the '
      'forecast rules out: give one of them'
    )
  if a.probe_autotune_level is not None:
    for given, what in (
      (a.batch_size is not None, '--batch_size (a fixed batch has no search)'),
      (a.search_resume, '--search_resume (its probes are cheap to redo)'),
      (a.verify_predicted_oom, '--verify_predicted_oom (its probes run nothing)'),
    ):
      if given:
        raise UsageError(f'--probe_autotune_level is for a search: not with {what}')


def _files(a: Args) -> None:
  """--output and --progress_file: files that can be written, and not the same one."""
  if a.output:
    problem = unwritable(a.output)
    if problem:
      raise UsageError(f'--output: {problem}')
  if a.progress_file:
    problem = unwritable(a.progress_file, replaced=True)
    if problem:
      raise UsageError(f'--progress_file: {problem}')
    if a.describe:
      raise UsageError('--describe runs nothing: it takes no --progress_file')
    if a.output and os.path.abspath(a.output) == os.path.abspath(a.progress_file):
      raise UsageError('--progress_file and --output must be different files')


def plan(a: Args) -> Plan:
  """Check the command line's values together; the plan of what to do."""
  from jaxbench.core import bench  # pylint: disable=g-import-not-at-top
  from jaxbench.pytorch import usage  # pylint: disable=g-import-not-at-top
  from models import registry  # pylint: disable=g-import-not-at-top

  if a.check and (a.describe or a.list_models):
    raise UsageError('--check validates a run: not with --describe or --list_models')
  if a.list_models and (a.describe or a.model):
    raise UsageError('--list_models takes no --model or --describe')
  if a.list_models:
    return Plan('list', tuple(registry.all_workloads()), bench.Options())
  if not a.model and not a.describe:
    raise UsageError(
      'choose a workload with --model=NAME (or --model=all); --list_models lists them'
    )
  workloads = resolve_models(a.model) if a.model else tuple(registry.all_workloads())
  try:
    usage.check(a, workloads)
  except usage.Refused as e:
    raise UsageError(str(e)) from None
  _search_conflicts(a)
  warnings = _hints(a.search_hints)
  if a.steps < a.windows:
    raise UsageError(f'--steps ({a.steps}) must be at least --windows ({a.windows})')
  if a.describe and (a.batch_size is not None or a.output):
    raise UsageError('--describe runs nothing: it takes no --batch_size or --output')
  overrides = parse_overrides(a.set)
  for w in workloads:
    try:
      cfg = w.resolve(tiny=bool(a.tiny), overrides=dict(overrides))
    except ValueError as e:
      raise UsageError(str(e)) from None
    if a.batch_size is not None and a.batch_size < w.example_size(cfg):
      raise UsageError(
        f'--batch_size={a.batch_size} is less than one example of {w.name} '
        f'({w.example_size(cfg)} {w.unit})'
      )
  _files(a)
  from jaxbench.core import mesh  # pylint: disable=g-import-not-at-top
  from jaxbench.train import options as train_options  # pylint: disable=g-import-not-at-top

  train = train_options.plan(a, workloads[0], cfg)
  sizes = {w.name: w.example_size(w.resolve(bool(a.tiny), dict(overrides))) for w in workloads}
  cards = bool(a.gpu or a.memory_gb or a.gpus or a.predict or a.compile_for)
  try:
    devices = mesh.plan(a.devices, a.batch_size, sizes, cards)
  except mesh.MeshError as e:
    raise UsageError(str(e)) from None
  options = bench.Options(
    precision=a.precision,
    tiny=bool(a.tiny),
    overrides=overrides,
    batch_size=a.batch_size,
    warmup_steps=a.warmup_steps,
    steps=a.steps,
    windows=a.windows,
    seed=a.seed,
    max_examples=a.max_examples,
    verify_predicted_oom=a.verify_predicted_oom,
    search_tolerance=a.search_tolerance,
    search_hints=tuple(a.search_hints),
    search_resume=a.search_resume,
    run_every_fit=a.run_every_fit,
    probe_autotune_level=a.probe_autotune_level,
    profile_dir=a.profile_dir,
    devices=devices,
    shard_optimizer=a.shard_optimizer,
    scaling=a.scaling,
  )
  action = 'describe' if a.describe else 'check' if a.check else 'run'
  return Plan(
    action,
    workloads,
    options,
    a.remat,
    a.output,
    a.progress_file,
    tuple(warnings),
    train,
    framework=a.framework,
    torch_compile=a.torch_compile,
  )
