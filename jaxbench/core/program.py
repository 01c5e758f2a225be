"""A workload's train step compiled at one batch size, its memory forecast, and its run."""

import copy
import ctypes
import dataclasses
import functools
import gc
import re
import threading
import time
from typing import Any

import jax
import numpy as np

from jaxbench.core import init_cache, mesh, pooled_draws
from models import precision
from models import workload as wl

# Messages that mean "the device ran out of memory". cuDNN and cuBLAS report a
# failed workspace allocation under memory pressure in their own words, and XLA's
# autotuner passes those on; they are out-of-memory too, not bugs.
_OOM_PATTERNS = re.compile(
  r'RESOURCE_EXHAUSTED|out of memory|OOM when allocating|Failed to allocate|'
  r'CUDNN_STATUS_ALLOC_FAILED|CUBLAS_STATUS_ALLOC_FAILED|CUDA_ERROR_OUT_OF_MEMORY|'
  r'cudaErrorMemoryAllocation|Allocator .* ran out of memory',
  re.IGNORECASE,
)


# Persistent compilation cache hits so far (--compilation_cache_dir), from JAX's monitoring
# events: a compile that took its executable from the cache is a load, not a compile.
_CACHE_HIT_EVENT = '/jax/compilation_cache/cache_hits'
_cache_hits = 0


def _count_cache_hits(event: str, **kwargs: Any) -> None:
  global _cache_hits
  del kwargs
  if event == _CACHE_HIT_EVENT:
    _cache_hits += 1


jax.monitoring.register_event_listener(_count_cache_hits)


def threefry_as_kernels():
  """A context in which JAX lowers each threefry draw to one CUDA kernel (a custom call) rather
  than its unrolled hash, for the programs that build the initial state and the synthetic batch.

  Unrolled, every parameter's draw is a large fusion of its own that XLA's GPU compiler and ptxas
  work through: BERT-base's initialization took 44 s to compile for an H200 (58 s on the GPU's
  host, of a 59 s first trial), 4 s as kernels; deeplabv3's 51 s, 11 s. The bits are the same
  threefry bits. Not for the step: there the kernel writes its bits to memory, where the
  unrolled hash fuses into the dropout that reads them, and the max batch would change. On a CPU
  it changes nothing.
  """
  from jax._src import config as jax_config  # pylint: disable=g-import-not-at-top

  return jax_config.threefry_gpu_kernel_lowering(True)


def is_oom(error: BaseException) -> bool:
  """Whether an exception from compiling or running XLA code is an out-of-memory."""
  return isinstance(error, MemoryError) or bool(_OOM_PATTERNS.search(str(error)))


def first_line(error: BaseException, limit: int = 300) -> str:
  text = str(error).strip().splitlines()
  return (f'{type(error).__name__}: {text[0] if text else ""}')[:limit]


@dataclasses.dataclass
class Compiled:
  """The step compiled for `n` examples, with XLA's memory forecast."""

  n: int
  executable: Any
  compile_s: float
  peak_bytes: int  # predicted device peak: arguments + outputs + temporaries - aliased
  temp_bytes: int
  argument_bytes: int
  cached: bool = False  # taken from the persistent compilation cache: compile_s was a load


class Program:
  """Compiles and runs one workload's step at any batch size (one config, one policy)."""

  def __init__(
    self,
    workload: wl.Workload,
    cfg: wl.Config,
    policy: precision.Policy,
    seed: int = 0,
    target: Any = None,
    layout: mesh.Layout | None = None,
    init_cache_dir: str | None = None,
  ):
    """`target`: a device to compile for without running (jaxbench.cards.deviceless), or None.

    `layout`: the mesh to train data-parallel on (mesh.py); then `n`, in compile and
    materialize, is the examples per device, and the batch holds n x layout.size.

    `init_cache_dir`: where the initial state's compiled program is kept between runs
    (init_cache.py; on one GPU), or None to compile it every run.
    """
    self.workload, self.cfg, self.policy = workload, cfg, policy
    self.target, self.layout = target, layout
    self.devices = 1 if layout is None else layout.size
    self.trainer = workload.trainer(cfg, policy)
    self.rng = jax.random.key(seed) if layout is None else layout.key(seed)
    # On one device the init is traced once, for its shapes here and its program in
    # initial_state (a trace of the model: 2 s for nasnet_large); on a mesh its out_shardings
    # come from the shapes, so it is traced again there.
    self._init_traced = None
    # The init's draws are made as a few large draws, not one per array (pooled_draws.py).
    self.init_pooled = True
    init = pooled_draws.pooled(self.trainer.init)
    if layout is None:
      self._init = jax.jit(init)
      with threefry_as_kernels():
        self._init_traced = self._init.trace(self.rng)
      self.state_shapes = self._init_traced.out_info
      self._state_shardings = None
    else:
      self.state_shapes = jax.eval_shape(init, self.rng)
      self._state_shardings = layout.state(self.state_shapes)
      self._init = jax.jit(init, out_shardings=self._state_shardings)
    # The state is donated: the step updates parameters and optimizer state in
    # place, so XLA may reuse their memory instead of holding two copies.
    placed = {}  # one device: where JAX puts it; on a mesh, the step keeps the state's layout
    if layout is not None:
      placed = {'out_shardings': (self._state_shardings, layout.sharding())}
    self._step = jax.jit(self.trainer.step, donate_argnums=(0,), **placed)
    self._batch = functools.cache(self._batch_fn)
    keep = layout is None and target is None and init_cache.usable()
    self._init_cache_dir = init_cache_dir if keep else None
    self._init_executable = None
    self.init_s: float | None = None  # the first initialization's seconds, compile included
    self.init_cached: bool | None = None  # whether its program was loaded from init_cache_dir
    # XLA options for this program's compiles only (DebugOptions fields, as XLA_FLAGS names them
    # without the dashes); None: the process's XLA_FLAGS alone.
    self.compiler_options: dict[str, Any] | None = None

  def autotuned_at(self, level: int) -> 'Program':
    """The same step, compiled with XLA's GEMM and convolution autotuning at `level` (0: off)
    whatever XLA_FLAGS say: a program of its own (its compiles, its cache entries), sharing
    this one's model and built state. For compile-only forecasts
    (probing.find_max_batch_probing)."""
    other = copy.copy(self)
    other.compiler_options = {**(self.compiler_options or {}), 'xla_gpu_autotune_level': level}
    return other

  def param_counts(self) -> dict[str, int]:
    return wl.param_counts(self.trainer, self.state_shapes)

  def _batch_fn(self, n: int):
    """The jitted maker of the batch for n examples per device, split over the mesh."""
    make = functools.partial(self.trainer.make_batch, n=n * self.devices)
    if self.layout is None:
      return jax.jit(make)
    return jax.jit(
      make, out_shardings=self.layout.batch(jax.eval_shape(make, self.rng), n * self.devices)
    )

  def compile(self, n: int) -> Compiled:
    """Lower and compile the step for n examples (per device); raises on failure (OOM
    included). With a layout, the memory forecast is one device's."""
    make = functools.partial(self.trainer.make_batch, n=n * self.devices)
    batch_shapes = jax.eval_shape(make, self.rng)
    start, hits = time.perf_counter(), _cache_hits
    executable = _interruptible(self._compile, batch_shapes, n)
    compile_s = time.perf_counter() - start
    mem = _interruptible(executable.memory_analysis)
    peak = temp = args = 0
    if mem is not None:
      temp, args = int(mem.temp_size_in_bytes), int(mem.argument_size_in_bytes)
      # XLA allocates the temporaries as one buffer beside the arguments; the sum
      # is what must fit. (memory_analysis' own peak_memory_in_bytes came out
      # below the temporaries alone on the H200, and that batch failed to run.)
      peak = (
        args
        + int(mem.output_size_in_bytes)
        + temp
        - int(mem.alias_size_in_bytes)
        + int(mem.generated_code_size_in_bytes)
      )
    return Compiled(
      n=n,
      executable=executable,
      compile_s=compile_s,
      peak_bytes=peak,
      temp_bytes=temp,
      argument_bytes=args,
      cached=_cache_hits > hits,
    )

  def _compile(self, batch_shapes, n: int):
    args = (self.state_shapes, batch_shapes, self.rng)
    if self.target is not None:  # everything abstract, placed on the described device
      from jaxbench.cards import deviceless  # pylint: disable=g-import-not-at-top

      args = deviceless.abstract((*args[:2], jax.eval_shape(lambda: self.rng)), self.target)
    elif self.layout is not None:
      args = (
        mesh.abstract(self.state_shapes, self._state_shardings),
        mesh.abstract(batch_shapes, self.layout.batch(batch_shapes, n * self.devices)),
        mesh.abstract(jax.eval_shape(lambda: self.rng), self.layout.sharding()),
      )
    with jax.default_matmul_precision(self.policy.matmul_precision):  # thread-local: set here
      return self._step.lower(*args).compile(compiler_options=self.compiler_options)

  def initial_state(self):
    """A fresh initial training state on the device (the step donates it), from one program
    compiled (or loaded) at the first call and run at every call."""
    start = time.perf_counter()
    if self._init_executable is None:
      with threefry_as_kernels():
        lowered = (self._init_traced or self._init.trace(self.rng)).lower()
      self._init_executable, self.init_cached = init_cache.compile(lowered, self._init_cache_dir)
    try:
      state = jax.block_until_ready(self._init_executable(self.rng))
    except Exception as e:  # pylint: disable=broad-except
      if not (self.init_pooled and is_oom(e)):
        raise
      e.__traceback__ = None
      del e
      release()
      state = self._per_array_initial_state()
    if self.init_s is None:
      self.init_s = time.perf_counter() - start
    return state

  def _per_array_initial_state(self):
    """The initial state drawn array by array, from now on: the pooled draws' temporaries did
    not fit beside the state (a memory cap of a few GB), and whether the state fits is for the
    step to decide, not for how its init draws."""
    self.init_pooled = False
    placed = {} if self.layout is None else {'out_shardings': self._state_shardings}
    self._init, self._init_traced = jax.jit(self.trainer.init, **placed), None
    with threefry_as_kernels():
      lowered = self._init.trace(self.rng).lower()
    self._init_executable, self.init_cached = init_cache.compile(lowered, self._init_cache_dir)
    return jax.block_until_ready(self._init_executable(self.rng))

  def materialize(self, n: int):
    """A fresh state and a batch of n examples (per device; built by a jitted function, where
    the step reads it)."""
    state = self.initial_state()
    with threefry_as_kernels():
      batch = self._batch(n)(jax.random.fold_in(self.rng, 1))
    return state, batch

  def run(self, compiled: Compiled, steps: int) -> float:
    """Run `steps` steps from a fresh state; returns the last loss. Frees everything after."""
    return _interruptible(self._run, compiled, steps)

  def _run(self, compiled: Compiled, steps: int) -> float:
    state = batch = metrics = None
    try:
      state, batch = self.materialize(compiled.n)
      for _ in range(steps):
        state, metrics = compiled.executable(state, batch, self.rng)
      return float(np.asarray(metrics['loss']))
    except Exception:
      # A failure's traceback holds the trial's arrays in reference cycles.
      del state, batch, metrics
      release()
      raise


_JOIN_SLICE_S = 0.5


def _interruptible(fn, *args):
  """fn(*args) in a worker thread, so that SIGINT during a long XLA call is seen at once.

  Python runs signal handlers only in the main thread between bytecodes, and a GPU compile
  with convolution autotuning can stay inside XLA for minutes (a trial's first steps, with
  the state's initialization, for tens of seconds): on the main thread, an interrupted search
  could not write its result before the SIGKILL that follows. Here the main thread waits,
  KeyboardInterrupt reaches it, and the abandoned call's thread is a daemon that cannot hold
  the process open (see interrupt.exit_now).
  """
  box: dict[str, Any] = {}

  def work():
    try:
      box['value'] = fn(*args)
    except BaseException as e:  # pylint: disable=broad-except
      box['error'] = e

  thread = threading.Thread(target=work, name='xla-call', daemon=True)
  thread.start()
  # SIGINT raises KeyboardInterrupt here. Joined in slices, not at once: a process-wide signal
  # that the kernel hands to another thread (it does when the main thread has one pending,
  # e.g. the SIGUSR1 of a stack dump just before) does not wake a blocked join, but the next
  # slice's return runs the Python handler on this thread.
  while thread.is_alive():
    thread.join(_JOIN_SLICE_S)
  if 'error' in box:
    raise box['error']
  return box['value']


def release() -> None:
  """Drop what a finished or failed trial left on the device."""
  gc.collect()


def release_host() -> None:
  """Drop what a compile left in the host's memory, for a process that compiles many programs
  and keeps none (a compile-only prediction): JAX's caches of traced, lowered and compiled
  programs (each batch is a program of its own, not compiled twice here; the next compile traces
  again, seconds against minutes), then the C library's free memory returned to the system.
  Without it a compile-only search of unsupmt held 2.3 GB more after each compile (7.5 GB after
  three) and a prediction for fourteen cards outgrew a 24 GB host; with it bert_base's held
  1.18 GB after five compiles, against 1.73 GB with the heap trimmed (and two malloc arenas)
  but the caches kept."""
  release()
  jax.clear_caches()
  try:
    trim = ctypes.CDLL(None).malloc_trim  # glibc's; other C libraries return memory their way
  except (OSError, AttributeError):
    return
  trim(0)


def device_memory() -> dict[str, int] | None:
  """The allocator's statistics for this process's first device (None on backends without
  them, e.g. CPU)."""
  stats = _interruptible(jax.local_devices()[0].memory_stats)  # takes the allocator's lock
  if not stats:
    return None
  return {k: int(v) for k, v in stats.items() if isinstance(v, (int, float))}
