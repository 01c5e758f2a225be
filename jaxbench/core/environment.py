"""The software a result ran on beyond JAX and Python: jaxlib, CUDA, cuDNN, the driver, flax,
optax and the git commit, each None where it cannot be read (no GPU, an installed copy)."""

import functools
import importlib.metadata
import os
import subprocess
from typing import Any

import jax

import jaxbench


def _package(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def _cuda_version(code: int | None) -> str | None:
  """CUDA's integer version as people write it: 12040 -> '12.4'."""
  return None if not code else f'{code // 1000}.{code % 1000 // 10}'


def _cudnn_version(code: int | None) -> str | None:
  """cuDNN's integer version as people write it: 90100 -> '9.1.0' (8xxx: 8.9.7 from 8907)."""
  if not code:
    return None
  if code >= 10000:
    return f'{code // 10000}.{code % 10000 // 100}.{code % 100}'
  return f'{code // 1000}.{code % 1000 // 100}.{code % 100}'


def _call(module: Any, name: str) -> int | None:
  """One of jaxlib's CUDA version queries, None where the plugin or the query is missing or
  fails (no GPU, no driver)."""
  fn = getattr(module, name, None)
  try:
    return int(fn()) if fn is not None else None
  except Exception:  # pylint: disable=broad-except
    return None


def _nvidia_smi_driver() -> str | None:
  """The NVIDIA driver's version (e.g. '550.54.15'), from nvidia-smi; None without it."""
  try:
    out = subprocess.run(
      ['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
      capture_output=True,
      text=True,
      timeout=30,
      check=True,
    ).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  lines = out.strip().splitlines()
  return lines[0].strip() if lines and lines[0].strip() else None


def _git_commit() -> str | None:
  """The commit of the checkout jaxbench runs from (with '+dirty' when its tracked files
  differ from it); None when it runs from an installed copy or git is missing."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(jaxbench.__file__)))
  if not os.path.exists(os.path.join(root, '.git')):
    return None
  try:
    head = subprocess.run(
      ['git', '-C', root, 'rev-parse', 'HEAD'], capture_output=True, text=True, timeout=30
    )
    if head.returncode != 0:
      return None
    dirty = subprocess.run(
      ['git', '-C', root, 'status', '--porcelain', '--untracked-files=no'],
      capture_output=True,
      text=True,
      timeout=30,
    )
  except (OSError, subprocess.SubprocessError):
    return None
  return head.stdout.strip() + ('+dirty' if dirty.returncode == 0 and dirty.stdout.strip() else '')


@functools.cache
def environment() -> dict[str, Any]:
  """The software a result ran on beyond JAX and Python: jaxlib, CUDA, cuDNN and the driver (as
  jaxlib's CUDA plugin and nvidia-smi report them; None without a GPU), flax, optax, and the git
  commit of the checkout (None outside one)."""
  try:
    from jax._src import lib as jax_lib  # pylint: disable=g-import-not-at-top

    versions = getattr(jax_lib, 'cuda_versions', None)
    jaxlib = getattr(jax_lib, 'version_str', None)
  except ImportError:
    versions, jaxlib = None, None
  on_gpu = any(d.platform == 'gpu' for d in jax.devices())
  cuda = versions if on_gpu else None
  return {
    'jaxlib_version': jaxlib or _package('jaxlib'),
    'cuda_version': _cuda_version(_call(cuda, 'cuda_runtime_get_version')),
    'cudnn_version': _cudnn_version(_call(cuda, 'cudnn_get_version')),
    'cuda_driver_version': _cuda_version(_call(cuda, 'cuda_driver_get_version')),
    'driver_version': _nvidia_smi_driver() if on_gpu else None,
    'flax_version': _package('flax'),
    'optax_version': _package('optax'),
    'git_commit': _git_commit(),
  }
