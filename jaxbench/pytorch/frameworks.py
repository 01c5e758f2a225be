"""--frameworks: the same run once per framework, each in a fresh process, side by side.

Each framework runs as `python -m jaxbench.main` with this command's flags, --framework=NAME and
--output to a file of its own, so that neither process shares memory, allocator or compiler
state with the other and each has the whole budget. This process imports neither framework's
runtime (JAX stays on the CPU here); it checks the flags for every framework first, then prints
each child's table as progress on stderr, and on stdout the results side by side with the ratios
(JAX over PyTorch). With --output every record goes there, each framework's in turn.
"""

import dataclasses
import os
import subprocess
import sys
import tempfile
from typing import Callable, Iterable

from jaxbench import cli
from jaxbench.core import backend
from jaxbench.results import records, store

# The flags this command rewrites for each child (the others pass unchanged).
_REWRITTEN = ('--frameworks', '--output', '--framework', '--tiny', '--notiny')


def child_args(argv: Iterable[str], framework: str, output: str, tiny: bool) -> list[str]:
  """This command's flags for the child measuring `framework`: --frameworks, --output and
  --framework replaced, the preset fixed to this command's, --torch_compile for PyTorch only."""
  out, skip = [], False
  for arg in argv:
    if skip:
      skip = False
      continue
    name = arg.split('=', 1)[0]
    if framework != 'pytorch' and name in ('--torch_compile', '--notorch_compile'):
      continue  # a flag of the PyTorch side only
    if name in _REWRITTEN:
      # absl also takes `--flag value` for the flags with values.
      skip = '=' not in arg and name in ('--frameworks', '--output', '--framework')
      continue
    out.append(arg)
  return [*out, f'--framework={framework}', f'--output={output}', '--tiny' if tiny else '--notiny']


def main(a: cli.Args, fail: Callable[[str], None], argv: list[str] | None = None) -> int:
  """Run each of a.frameworks in turn; the exit status is the worst of theirs."""
  env = dict(os.environ)  # the children start from the caller's environment
  tiny = a.tiny if a.tiny is not None else backend.gpu_total_bytes() is None
  os.environ['JAX_PLATFORMS'] = 'cpu'  # this process only checks and waits
  try:
    plan = cli.plan(dataclasses.replace(a, tiny=tiny))
  except cli.UsageError as e:
    fail(str(e))
  if a.check:
    for line in plan.warnings:
      print(f'jaxbench: {line}', file=sys.stderr)
    names = ', '.join(w.name for w in plan.workloads)
    print(f'jaxbench: ok: the flags are valid for {names} under {", ".join(a.frameworks)}')
    return 0
  argv = sys.argv[1:] if argv is None else argv
  try:
    with store.Lock(a.output, shared=True):  # not beside a sweep on the same store
      status, results = _run_each(a, argv, tiny, env)
  except store.Busy as e:
    fail(f'--output: {e}')
  print()
  print(records.side_by_side(results))
  return status


def _run_each(a: cli.Args, argv: list[str], tiny: bool, env: dict[str, str]):
  """Each framework's child in turn: the worst exit status, and every record they wrote."""
  status, results = 0, []
  for framework in a.frameworks:
    with tempfile.TemporaryDirectory(prefix='jaxbench-') as tmp:
      path = os.path.join(tmp, f'{framework}.jsonl')
      cmd = [sys.executable, '-m', 'jaxbench.main', *child_args(argv, framework, path, tiny)]
      print(f'jaxbench: {framework}: {" ".join(cmd[1:])}', file=sys.stderr, flush=True)
      proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=False)
      sys.stderr.write(proc.stdout)  # the child's own table: progress, here
      status = max(status, proc.returncode)
      produced, warning = store.read(path)
      if warning:
        print(warning, file=sys.stderr)
      for r in produced:
        results.append(r)
        if a.output:
          records.append_jsonl(a.output, r)
  return status, results
