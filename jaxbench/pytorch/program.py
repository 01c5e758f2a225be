"""A PyTorch peer at any batch size, with the interface of jaxbench.core.program.Program that the
max-batch search and the timing use: `.workload`, `.cfg`, `.compile(n)`, `.run(compiled, steps)`.

PyTorch has no memory forecast: compile(n) builds nothing and forecasts nothing (peak_bytes None,
so the search doubles and bisects), and run() builds the peer at n examples from a fresh seed,
runs real steps and frees everything. On a GPU the allocator's cap
(torch.cuda.set_per_process_memory_fraction, set by the bench) decides fits: a step over it
raises torch.OutOfMemoryError (or a cuDNN/cuBLAS allocation failure), which the probe marks out
of memory. After a failed trial every tensor it made is released (its traceback cleared, gc,
the caching allocator emptied) and the bytes in use are checked to be those before it, so that
the next trial starts from the same memory. On the CPU, which has no allocator cap, the budget
bounds an estimate of the bytes one iteration holds (parameters, gradients, optimizer state,
the batch and every tensor saved for backward, each storage once), and a trial over it raises
torch.OutOfMemoryError as the GPU would.
"""

import dataclasses
import gc
import itertools
import time
from typing import Any

import torch

from jaxbench.core import program as prog
from jaxbench.core import timing
from jaxbench.pytorch import policy as policy_lib
from models import workload as wl
from models.pytorch import peer as peer_lib


@dataclasses.dataclass
class Live:
  """A peer built at n examples: its networks and optimizers, the batch, the gradient scaler."""

  setup: peer_lib.Setup
  batch: Any
  scaler: Any


def _tensors(tree: Any):
  if isinstance(tree, torch.Tensor):
    yield tree
  elif isinstance(tree, dict):
    for v in tree.values():
      yield from _tensors(v)
  elif isinstance(tree, (list, tuple)):
    for v in tree:
      yield from _tensors(v)


def compile_scope(
  setup: peer_lib.Setup, compiled: tuple[str, ...] | None, backend: str = 'inductor'
) -> None:
  """--torch_compile: each update's loss under torch.compile, or the modules the peer names
  (Peer.compiled) in place, their parameters and state_dict keys unchanged; static shapes."""
  if compiled is None:
    for update in setup.updates:
      update.loss = torch.compile(update.loss, dynamic=False, backend=backend)
  else:
    for path in compiled:
      name, _, submodule = path.partition('.')
      setup.modules[name].get_submodule(submodule).compile(dynamic=False, backend=backend)


class Program:
  """Builds and runs one peer's training iteration at any batch size (one config, one policy)."""

  def __init__(
    self,
    workload: wl.Workload,
    cfg: wl.Config,
    peer: peer_lib.Peer,
    policy: policy_lib.Policy,
    device: torch.device,
    seed: int = 0,
    torch_compile: bool = False,
    cpu_budget_bytes: int | None = None,
  ):
    self.workload, self.cfg, self.peer, self.policy = workload, cfg, peer, policy
    self.device, self.seed, self.torch_compile = device, seed, torch_compile
    self.cpu_budget_bytes = cpu_budget_bytes if device.type == 'cpu' else None
    self.autocast = policy_lib.autocast(policy, device)
    self.init_s: float | None = None  # the first build's seconds (parameters and optimizers)
    # The first trial's first step, synced: under torch.compile, the compile from a cold cache
    # (later trials and the timed run reload Inductor's on-disk caches after release()).
    self.first_step_s: float | None = None
    self.estimated_bytes: int | None = None  # the last CPU estimate of an iteration's bytes

  def param_counts(self) -> dict[str, int]:
    """The total, and each network's where there are several (built on 'meta': no memory)."""
    setup = self.peer.build(self.cfg, torch.device('meta'))
    counts = {'total': setup.param_count()}
    if len(setup.modules) > 1:
      counts.update({k: sum(p.numel() for p in m.parameters()) for k, m in setup.modules.items()})
    return counts

  def compile(self, n: int) -> prog.Compiled:
    """Nothing to compile ahead and no forecast: the first step compiles (torch.compile)."""
    return prog.Compiled(
      n=n, executable=None, compile_s=None, peak_bytes=None, temp_bytes=None, argument_bytes=None
    )

  def sync(self) -> None:
    if self.device.type == 'cuda':
      torch.cuda.synchronize(self.device)

  def materialize(self, n: int) -> Live:
    """The peer built from the seed, a batch of n examples, and (fp16) a fresh scaler; on the
    CPU under a budget, out of memory when one iteration's estimated bytes exceed it."""
    torch.manual_seed(self.seed)
    start = time.perf_counter()
    setup = self.peer.build(self.cfg, self.device)
    self.sync()
    if self.init_s is None:
      self.init_s = time.perf_counter() - start
    generator = torch.Generator(device=self.device).manual_seed(self.seed + 1)
    batch = self.peer.make_batch(self.cfg, n, generator, self.device)
    live = Live(setup, batch, policy_lib.scaler(self.policy, self.device, self.peer.loss_scale))
    if self.cpu_budget_bytes is not None:
      self.estimated_bytes = self._estimate(live)
      if self.estimated_bytes > self.cpu_budget_bytes:
        raise torch.OutOfMemoryError(
          f'CPU budget: out of memory, an iteration holds about {self.estimated_bytes:,} B > '
          f'budget {self.cpu_budget_bytes:,} B'
        )
    if self.torch_compile:
      compile_scope(setup, self.peer.compiled)
    return live

  def _estimate(self, live: Live) -> int:
    """The bytes one eager iteration holds at its peak, counted from its tensors (CPU only)."""
    # Each storage is held until the count ends, so that no address is freed and reused by
    # another storage, which would then count once for two.
    storages: dict[int, torch.UntypedStorage] = {}

    def add(t: torch.Tensor) -> torch.Tensor:
      s = t.untyped_storage()
      storages[s.data_ptr()] = s
      return t

    with torch.autograd.graph.saved_tensors_hooks(add, lambda t: t):
      self.step(live, 0)
    for module in live.setup.modules.values():
      for p in module.parameters():
        add(p)
        if p.grad is not None:
          add(p.grad)
    for update in live.setup.updates:
      for state in update.optimizer.state.values():
        for t in _tensors(state):
          add(t)
    for t in _tensors(live.batch):
      add(t)
    return sum(s.nbytes() for s in storages.values())

  def step(self, live: Live, i: int) -> torch.Tensor:
    """One training iteration (peer.run_updates); the last update's loss, not synced."""
    return peer_lib.run_updates(live.setup, live.batch, i, self.autocast, live.scaler)

  def run(self, compiled: prog.Compiled, steps: int) -> float:
    """Run `steps` iterations of a fresh peer at compiled.n examples; returns the last loss.
    Frees everything after; after an out-of-memory, checks that nothing stayed allocated."""
    before = self.bytes_in_use()
    error = None
    try:
      loss = self._run(compiled.n, steps)
    except Exception as e:  # pylint: disable=broad-except
      e.__traceback__ = None  # its frames hold the trial's tensors
      error = e
    self.release()
    if error is None:
      return loss
    after = self.bytes_in_use()
    if prog.is_oom(error) and after != before:
      # Not worded as an out-of-memory: the search stops here with an error.
      raise RuntimeError(
        f'{after - before} bytes stayed allocated after the failed trial at {compiled.n} examples,'
        ' so the next trials would not start from the same memory'
      )
    raise error

  def _run(self, n: int, steps: int) -> float:
    live = self.materialize(n)
    loss = None
    for i in range(steps):
      start = time.perf_counter()
      loss = self.step(live, i)
      if self.first_step_s is None:
        self.sync()
        self.first_step_s = time.perf_counter() - start
    return float(loss)

  def release(self) -> None:
    """Drop what a trial left: its objects, torch.compile's graphs, the allocator's cache."""
    gc.collect()
    if self.torch_compile:
      torch._dynamo.reset()  # pylint: disable=protected-access
    if self.device.type == 'cuda':
      clear = getattr(torch._C, '_cuda_clearCublasWorkspaces', None)  # pylint: disable=protected-access
      if clear is not None:
        clear()  # cuBLAS keeps its workspace in the allocator until told
      torch.cuda.empty_cache()

  def bytes_in_use(self) -> int | None:
    return torch.cuda.memory_allocated(self.device) if self.device.type == 'cuda' else None

  def device_memory(self) -> dict[str, int] | None:
    """The allocator's statistics as prog.device_memory names them (the probe records them)."""
    if self.device.type == 'cuda':
      return {
        'bytes_in_use': torch.cuda.memory_allocated(self.device),
        'peak_bytes_in_use': torch.cuda.max_memory_allocated(self.device),
      }
    if self.estimated_bytes is not None:
      return {'peak_bytes_in_use': self.estimated_bytes}
    return None


def measure(
  program: Program, n: int, warmup_steps: int, steps: int, windows: int
) -> tuple[timing.Measurement, float | None]:
  """Time `steps` iterations at n examples in `windows` windows after `warmup_steps` untimed ones,
  as timing.measure does for JAX: each window ends with a device synchronize, not each step.
  Also returns the first warm-up step's seconds (with torch.compile, the compile), or None
  without warm-up."""
  per_window = max(1, steps // windows)
  if program.device.type == 'cuda':  # the peak of the timed batch, not of the search's trials
    torch.cuda.reset_peak_memory_stats(program.device)
  live = [program.materialize(n)]
  calls = itertools.count()  # the iteration index each step gets
  try:
    times, loss, first_s = timing.windows(
      lambda: program.step(live[0], next(calls)),
      lambda _: program.sync(),
      warmup_steps,
      per_window,
      windows,
    )
    final = float(loss)
  finally:
    live.clear()  # freed before the peak is read
  stats = program.device_memory()
  m = timing.Measurement(
    examples=n,
    warmup_steps=warmup_steps,
    steps_per_window=per_window,
    window_step_s=times,
    final_loss=final,
    process_peak_bytes=stats.get('peak_bytes_in_use') if stats else None,
  )
  return m, first_s
