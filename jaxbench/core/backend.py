"""Set up XLA before the JAX backend starts: memory cap, rematerialization, caches.

Everything here acts through environment variables that JAX and XLA read once,
when the backend initializes. `configure` must therefore run before the first
`jax.devices()` (jaxbench.main calls it first thing); it refuses otherwise
rather than silently measuring the wrong thing.
"""

import dataclasses
import glob
import os
import shutil
import subprocess
import sys

# JAX preallocates 75% of the GPU by default. We give the allocator the card:
# 95% of it, leaving room for the CUDA context, cuBLAS/cuDNN handles and
# anything else outside XLA's pool (override with XLA_PYTHON_CLIENT_MEM_FRACTION).
DEFAULT_MEM_FRACTION = 0.95
# XLA's GPU rematerialization limit is 80% of device memory x slop / 100.
_XLA_REMAT_BASE = 0.80


class BackendError(RuntimeError):
  pass


@dataclasses.dataclass(frozen=True)
class MemorySetup:
  """What the run asked of memory, and how it was enforced."""

  gpu_total_bytes: int | None  # the card's memory as nvidia-smi reports it
  limit_bytes: int | None  # the cap asked for (--memory_limit_gb), if any
  mem_fraction: float | None  # the allocator fraction set for the GPU
  remat: bool

  def describe(self) -> str:
    if self.limit_bytes is None:
      return 'full device memory'
    how = (
      'allocator capped'
      if self.mem_fraction is not None
      else 'checked against compile-time analysis'
    )
    return f'{self.limit_bytes / 1e9:.1f} GB limit ({how})'


def gpu_total_bytes() -> int | None:
  """Memory of the first GPU this process may use (CUDA_VISIBLE_DEVICES' first, else GPU 0)
  from nvidia-smi, read without starting JAX; None without a GPU."""
  if os.environ.get('JAX_PLATFORMS', '').lower() in ('cpu',) or not shutil.which('nvidia-smi'):
    return None
  first = (os.environ.get('CUDA_VISIBLE_DEVICES') or '0').split(',')[0].strip() or '0'
  try:
    out = subprocess.run(
      ['nvidia-smi', '--query-gpu=memory.total', '--format=csv,noheader,nounits', '-i', first],
      capture_output=True,
      text=True,
      timeout=30,
      check=True,
    ).stdout
    return int(float(out.strip().splitlines()[0])) * 2**20  # MiB
  except (subprocess.SubprocessError, ValueError, IndexError, OSError):
    return None


def _add_xla_flags(*flags: str) -> None:
  current = os.environ.get('XLA_FLAGS', '').split()
  os.environ['XLA_FLAGS'] = ' '.join(current + [f for f in flags if f not in current])


def configure(
  memory_limit_gb: float | None,
  remat: bool,
  compilation_cache_dir: str | None = None,
  triton_gemm: bool = False,
  autotune_level: int | None = None,
  autotune_cache_dir: str | None = None,
  autotune_log: str | None = None,
) -> MemorySetup:
  """Fix the memory cap and XLA options; call before JAX's backend starts."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top

  if xla_bridge.backends_are_initialized():
    raise BackendError(
      'the JAX backend already started: memory and XLA options must be set '
      'in a fresh process, before the first use of JAX devices'
    )
  total = gpu_total_bytes()
  if total is None and not glob.glob('/dev/nvidia[0-9]*'):
    # No NVIDIA GPU here: JAX on the CPU, without first trying the CUDA plugin that
    # `pip install -e '.[cuda]'` brings (it prints a traceback when it finds no GPU).
    if 'JAX_PLATFORMS' not in os.environ:
      os.environ['JAX_PLATFORMS'] = 'cpu'
      if 'jax' in sys.modules:  # imported already: its config has read the environment
        sys.modules['jax'].config.update('jax_platforms', 'cpu')
  limit = None if memory_limit_gb is None else int(memory_limit_gb * 1e9)
  fraction = None
  if total is not None:
    if limit is not None:
      if limit > total:
        raise BackendError(
          f'--memory_limit_gb={memory_limit_gb} exceeds the GPU\'s {total / 1e9:.1f} GB'
        )
      fraction = limit / total
      os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION'] = f'{fraction:.6f}'
    else:
      fraction = float(
        os.environ.setdefault('XLA_PYTHON_CLIENT_MEM_FRACTION', str(DEFAULT_MEM_FRACTION))
      )
    os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'true')
    if remat:
      # Point XLA's rematerialization at the pool we actually have.
      pool = fraction * total
      _add_xla_flags(
        f'--xla_gpu_memory_limit_slop_factor={int(100 * pool / (_XLA_REMAT_BASE * total))}'
      )
  if not triton_gemm:
    # XLA autotunes every matmul over many Triton tilings as well as cuBLAS; on
    # the H200 that made a BERT-base fp32 compile take over a minute. cuBLAS
    # alone (what PyTorch uses) keeps the search's many compiles affordable.
    _add_xla_flags('--xla_gpu_enable_triton_gemm=false')
  if autotune_level is not None:
    _add_xla_flags(f'--xla_gpu_autotune_level={autotune_level}')
  if autotune_cache_dir:
    os.makedirs(autotune_cache_dir, exist_ok=True)
    _add_xla_flags(f'--xla_gpu_per_fusion_autotune_cache_dir={os.path.abspath(autotune_cache_dir)}')
  if autotune_log:
    os.makedirs(os.path.dirname(os.path.abspath(autotune_log)), exist_ok=True)
    _add_xla_flags(f'--xla_gpu_dump_autotune_logs_to={os.path.abspath(autotune_log)}')
  if not remat:
    # Without this XLA quietly recomputes activations once a program exceeds its
    # memory limit, and "max batch" would mean "max batch with recomputation".
    _add_xla_flags('--xla_disable_hlo_passes=rematerialization')
  if compilation_cache_dir:
    import jax  # pylint: disable=g-import-not-at-top

    jax.config.update('jax_compilation_cache_dir', compilation_cache_dir)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 1.0)
    jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
    if autotune_cache_dir:
      # With a persistent compilation cache JAX points XLA's autotune cache into it
      # (DIR/xla_gpu_per_fusion_autotune_cache_dir, jax_persistent_cache_enable_xla_caches),
      # over XLA_FLAGS. Turned off here, so that the autotuning results go to
      # --autotune_cache_dir; left on, they go into the compilation cache's directory and
      # --autotune_cache_dir stays empty.
      jax.config.update('jax_persistent_cache_enable_xla_caches', '')
  return MemorySetup(gpu_total_bytes=total, limit_bytes=limit, mem_fraction=fraction, remat=remat)
