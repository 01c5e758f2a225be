"""The initial state's compiled program, kept on disk from one run to the next.

Building the initial state is one jitted program with a random draw for each parameter array,
and XLA's compile of it is most of what it costs: on an H200's host 3 to 9 s for most workloads
and 19 s for nasnet_large's 2,566 arrays, every run, for a program that then runs in
milliseconds. Its executable is kept under a key that names everything the compile depends on
(the lowered program's text, JAX and jaxlib, the device and its software, XLA's flags), so a
later run of the same program loads it instead. The train step is never kept here: its compile
time is part of what a run measures (--compilation_cache_dir keeps it too, by choice).

On GPUs only: XLA:CPU's deserialized executables failed to run beside others in one process
("Function slice_bitcast_fusion.2 not found"), and a CPU's initializations are small.
"""

import hashlib
import os
import tempfile
from typing import Any

import jax
import jaxlib
from jax.experimental import serialize_executable


def default_dir() -> str:
  """$XDG_CACHE_HOME/jaxbench/init, ~/.cache/jaxbench/init without it."""
  root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(root, 'jaxbench', 'init')


def usable() -> bool:
  """Whether this process's devices take a kept program: GPUs."""
  return jax.default_backend() == 'gpu'


def _key(lowered: Any) -> str:
  device = jax.devices()[0]
  parts = [
    lowered.as_text(),
    jax.__version__,
    jaxlib.__version__,
    device.platform,
    device.device_kind,
    device.client.platform_version,
    os.environ.get('XLA_FLAGS', ''),
  ]
  return hashlib.sha256('\n'.join(parts).encode()).hexdigest()


def compile(lowered: Any, directory: str | None) -> tuple[Any, bool]:  # pylint: disable=redefined-builtin
  """`lowered` compiled, or loaded from `directory` where an earlier run kept it; and whether
  it was loaded. A missing, unreadable or stale entry is compiled and written again; a cache
  that cannot be written leaves the run as it would be without one."""
  if not directory:
    return lowered.compile(), False
  path = os.path.join(directory, _key(lowered) + '.xla')
  try:
    with open(path, 'rb') as f:
      payload = f.read()
    return serialize_executable.deserialize_and_load(
      payload, lowered.in_tree, lowered.out_tree
    ), True
  except Exception:  # pylint: disable=broad-except
    pass  # not there yet, or written by a build that cannot load it: compile it again
  compiled = lowered.compile()
  try:
    payload, _, _ = serialize_executable.serialize(compiled)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix='.tmp')
    with os.fdopen(fd, 'wb') as f:
      f.write(payload)
    os.replace(tmp, path)  # whole or not at all: a concurrent run reads one or the other
  except Exception:  # pylint: disable=broad-except
    pass
  return compiled, False
