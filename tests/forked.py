"""Many short command lines at the cost of one Python start: each runs as `python -m MODULE ARGS`
does, in its own process with its own exit status, stdout and stderr, forked from a parent that
has imported JAX and the models once (importing them is most of a second or two that each
refused command line takes on two CPU cores).

For command lines that end before the backend starts, or soon after (bad input, --check,
--list_models, --describe): the parent starts no backend, so each child starts its own as a
fresh process would. A child ends as the interpreter does (threads joined, atexit functions run,
streams flushed) but without tearing down its modules and heap.
"""

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What the parent imports before it forks: what a run imports anyway, none of it starts JAX.
IMPORTS = ('jax', 'flax', 'optax', 'models.registry', 'jaxbench.main')

_PARENT = r"""
import atexit, json, os, runpy, sys, threading
spec = json.loads(sys.stdin.read())
for name in spec['imports']:
  __import__(name)
sys.modules.pop(spec['module'], None)  # runpy runs it afresh as __main__, as `python -m` does
codes = []
for i, argv in enumerate(spec['runs']):
  sys.stdout.flush()
  sys.stderr.flush()
  pid = os.fork()
  if pid == 0:  # the child: argv's run, its exit (SystemExit) the end of this interpreter
    for fd, name in ((1, 'out'), (2, 'err')):
      f = os.open(os.path.join(spec['dir'], f'{i}.{name}'), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
      os.dup2(f, fd)
      os.close(f)
    sys.argv = [spec['module'], *argv]
    try:
      runpy.run_module(spec['module'], run_name='__main__', alter_sys=True)
      code = 0
    except SystemExit as e:  # its status as the interpreter would make it; other errors end it
      code = e.code if isinstance(e.code, int) else int(e.code is not None)
      if code and not isinstance(e.code, int):
        print(e.code, file=sys.stderr)
    # The interpreter's own exit, less the teardown of its modules and heap: the threads joined,
    # the atexit functions run, the streams flushed (the teardown took a second or two a child
    # with torch and JAX imported).
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
  codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print(json.dumps(codes))
"""


def run(
  runs: list[list[str]],
  module: str = 'jaxbench.main',
  env: dict[str, str] | None = None,
  timeout: float = 600,
) -> list[subprocess.CompletedProcess]:
  """Each of `runs` (its arguments) as `python -m module *args` in ROOT, one after the other."""
  with tempfile.TemporaryDirectory() as tmp:
    spec = {'imports': IMPORTS, 'runs': runs, 'module': module, 'dir': tmp}
    parent = subprocess.run(
      [sys.executable, '-c', _PARENT],
      input=json.dumps(spec),
      cwd=ROOT,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu'} if env is None else env,
      capture_output=True,
      text=True,
      timeout=timeout,
    )
    assert parent.returncode == 0, parent.stderr[-3000:]
    codes = json.loads(parent.stdout.splitlines()[-1])
    done = []
    for i, (args, code) in enumerate(zip(runs, codes)):
      with open(os.path.join(tmp, f'{i}.out')) as out, open(os.path.join(tmp, f'{i}.err')) as err:
        done.append(subprocess.CompletedProcess(args, code, out.read(), err.read()))
  return done
