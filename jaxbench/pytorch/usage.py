"""What a PyTorch run accepts, checked by cli.plan, and the memory it gets; imports no torch."""

import os
import sys
from typing import Any

from jaxbench.core import backend

INSTALL = "pip install -e '.[pytorch]'"
# The flags whose work only the JAX side has (a compiler forecast, XLA's passes, a jax.profiler
# trace, training with Orbax checkpoints), and the sweeps and predictions built on them.
_JAX_ONLY = (
  ('predict', '--predict'),
  ('compile_for', '--compile_for'),
  ('gpus', '--gpus'),
  ('store', '--store'),
  ('remat', '--remat'),
  ('verify_predicted_oom', '--verify_predicted_oom'),
  ('search_resume', '--search_resume'),
  ('probe_autotune_level', '--probe_autotune_level'),
  ('profile_dir', '--profile_dir'),
  ('train_steps', '--train_steps'),
  ('checkpoint_dir', '--checkpoint_dir'),
)
# XLA's compiler options and the earlier results that aim JAX's search: a PyTorch run refuses
# them, and --frameworks gives them to its JAX children only (frameworks.child_args).
JAX_SIDE = (
  ('search_hints', '--search_hints'),
  ('compilation_cache_dir', '--compilation_cache_dir'),
  ('autotune_level', '--autotune_level'),
  ('autotune_cache_dir', '--autotune_cache_dir'),
  ('autotune_log', '--autotune_log'),
  ('triton_gemm', '--triton_gemm'),
)


class Refused(ValueError):
  """A PyTorch run the command line cannot make: one line."""


def frameworks(a: Any) -> tuple[str, ...]:
  """The frameworks the command line `a` (cli.Args) measures, in order."""
  return tuple(a.frameworks) or (a.framework,)


def torch_missing() -> str | None:
  """Why torch cannot be imported, with the extra to install; None when it can."""
  try:
    import torch  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return f'--framework=pytorch needs PyTorch, which is not installed: {INSTALL}'
  return None


def check_comparison(a: Any) -> None:
  """Refused (one line) for the flags of a comparison (--frameworks) that conflict."""
  if a.reference_batch and not a.frameworks:
    raise Refused('--reference_batch compares frameworks: give --frameworks=jax,pytorch')
  if a.reference_batch and a.batch_size is not None:
    raise Refused('--reference_batch and --batch_size conflict: give one')
  if a.frameworks and a.precisions and a.precision:
    raise Refused('--precision and --precisions conflict: give one')


def check(a: Any, workloads: tuple) -> None:
  """Refused (one line) for what a run measuring `frameworks(a)` of `workloads` cannot do."""
  if a.frameworks and a.framework != 'jax':
    raise Refused('--framework and --frameworks conflict: give one')
  check_comparison(a)
  chosen = frameworks(a)
  if a.torch_compile and 'pytorch' not in chosen:
    raise Refused(
      '--torch_compile compiles the PyTorch side: give --framework=pytorch or '
      '--frameworks=jax,pytorch'
    )
  if 'pytorch' not in chosen:
    return
  for field, name in _JAX_ONLY + (() if a.frameworks else JAX_SIDE):
    value = getattr(a, field)
    if value not in (None, False, ()):
      raise Refused(f'{name} is for JAX runs: not with the pytorch framework')
  if not a.run_every_fit:
    raise Refused('--norun_every_fit is for JAX runs: not with the pytorch framework')
  if a.devices != '1' or a.shard_optimizer or a.scaling:
    raise Refused('--devices, --shard_optimizer and --scaling are for JAX runs: PyTorch runs one')
  missing = torch_missing()
  if missing:
    raise Refused(missing)
  from models.pytorch import registry  # pylint: disable=g-import-not-at-top

  for w in workloads:
    try:
      registry.get(w.name)
    except KeyError as e:
      raise Refused(e.args[0]) from None


def prepare(limit_gb: float | None) -> backend.MemorySetup:
  """The memory of a PyTorch run, read before anything starts CUDA, and JAX kept on the CPU.

  The PyTorch allocator gets the budget a JAX run gets: `limit_gb` (--memory_limit_gb, or the
  emulated card's memory), else backend.DEFAULT_MEM_FRACTION of the GPU. JAX, which this process
  imports only to resolve the workload's config, must not take the GPU's memory.
  """
  total = backend.gpu_total_bytes()
  limit = None if limit_gb is None else int(limit_gb * 1e9)
  fraction = None
  if total is not None:
    if limit is not None and limit > total:
      raise backend.BackendError(
        f'--memory_limit_gb={limit_gb} exceeds the GPU\'s {total / 1e9:.1f} GB'
      )
    fraction = backend.DEFAULT_MEM_FRACTION if limit is None else limit / total
  os.environ['JAX_PLATFORMS'] = 'cpu'
  if 'jax' in sys.modules:  # imported already: its config has read the environment
    sys.modules['jax'].config.update('jax_platforms', 'cpu')
  return backend.MemorySetup(
    gpu_total_bytes=total, limit_bytes=limit, mem_fraction=fraction, remat=False
  )


def on_gpu() -> bool:
  """Whether PyTorch sees a CUDA GPU (without torch: no, and the plan says what is missing)."""
  if torch_missing():
    return False
  import torch  # pylint: disable=g-import-not-at-top

  return torch.cuda.is_available()
