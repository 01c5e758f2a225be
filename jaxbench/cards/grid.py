"""A sweep's grid: cells of workload x GPU x precision, the processes they share, their commands."""

import dataclasses
import os
import sys

from jaxbench import cli
from jaxbench.results import store


@dataclasses.dataclass(frozen=True)
class Cell:
  mode: str  # 'run' (emulated run) or 'predict'
  workload: str
  gpu: str  # catalog name
  precision: str
  tiny: bool
  overrides: tuple[tuple[str, str], ...] = ()

  @property
  def key(self) -> store.Key:
    return store.key(self.mode, self.workload, self.gpu, self.precision, self.tiny, self.overrides)

  def label(self) -> str:
    extra = ''.join(
      [
        ' tiny' if self.tiny else '',
        ' predict' if self.mode == 'predict' else '',
        ''.join(f' {k}={v}' for k, v in self.overrides),
      ]
    )
    return f'{self.workload} {self.precision} on {self.gpu}{extra}'


def plan(
  workloads: list[tuple[str, str]],
  gpus: list[str],
  precisions: list[str] | None,
  tiny: bool,
  overrides: tuple[tuple[str, str], ...],
  mode: str,
) -> list[Cell]:
  """Cells in order: workload, then precision, then GPU. workloads: (name, default precision)."""
  return [
    Cell(mode, name, gpu, p, tiny, tuple(sorted(overrides)))
    for name, default in workloads
    for p in (precisions or [default])
    for gpu in gpus
  ]


def groups(cells: list[Cell]) -> list[list[Cell]]:
  """What one process runs: one cell, or a --predict workload-precision's cards together."""
  out: dict[tuple, list[Cell]] = {}
  for c in cells:
    k = (c.workload, c.precision, c.tiny, c.overrides) if c.mode == 'predict' else c.key
    out.setdefault(k, []).append(c)
  return list(out.values())


def command(
  group: list[Cell], store_path: str, passthrough: list[str], hint_files: tuple[str, ...] = ()
) -> list[str]:
  """The jaxbench.main command line that runs one group and appends to the store.

  The store itself aims each cell's search (--search_hints): the cells already done for the
  same workload and precision on other cards forecast where this card's boundary lies.
  """
  c = group[0]
  hint = [*hint_files, *([store_path] if os.path.isfile(store_path) else [])]
  cards = (
    ['--predict', f'--gpus={",".join(x.gpu for x in group)}']
    if c.mode == 'predict'
    else [f'--gpu={c.gpu}']
  )
  return [
    sys.executable,
    '-m',
    'jaxbench.main',
    f'--model={c.workload}',
    f'--precision={c.precision}',
    '--tiny' if c.tiny else '--notiny',
    *[f'--set={k}={v}' for k, v in c.overrides],
    *cards,
    f'--output={store_path}',
    *([] if c.mode == 'predict' else [f'--progress_file={progress_path(store_path)}']),
    *[a for a in passthrough if _applies(a, c, bool(hint))],
    *([f'--search_hints={",".join(hint)}'] if hint else []),
  ]


def _applies(arg: str, cell: Cell, hinted: bool) -> bool:
  """Whether a passed-through flag applies to this cell's process: a resumed search goes on from
  the store's trials (nothing to resume from before there is a store), and --predict compiles
  only (nothing to resume or run)."""
  if arg == '--search_resume':
    return hinted and cell.mode != 'predict'
  if arg == '--norun_every_fit':
    return cell.mode != 'predict'
  return True


def progress_path(store_path: str) -> str:
  """Where a running cell keeps its result so far (jaxbench --progress_file)."""
  return store_path + '.progress'


def passthrough(a: cli.Args) -> list[str]:
  """The flags of this command that every cell's process gets unchanged."""
  args = [
    f'--steps={a.steps}',
    f'--windows={a.windows}',
    f'--warmup_steps={a.warmup_steps}',
    f'--seed={a.seed}',
    f'--max_examples={a.max_examples}',
    f'--search_tolerance={a.search_tolerance}',
    '--remat' if a.remat else '--noremat',
    '--triton_gemm' if a.triton_gemm else '--notriton_gemm',
    '--verify_predicted_oom' if a.verify_predicted_oom else '--noverify_predicted_oom',
  ]
  if a.autotune_level is not None:
    args.append(f'--autotune_level={a.autotune_level}')
  if a.probe_autotune_level is not None:
    args.append(f'--probe_autotune_level={a.probe_autotune_level}')
  if a.compilation_cache_dir:
    args.append(f'--compilation_cache_dir={a.compilation_cache_dir}')
  if a.autotune_cache_dir:
    args.append(f'--autotune_cache_dir={a.autotune_cache_dir}')
  if a.search_resume:
    args.append('--search_resume')
  if not a.run_every_fit:
    args.append('--norun_every_fit')
  return args
