"""Data parallelism: a one-axis `data` mesh, its shardings, and several hosts' start.

The batch is split over the mesh's `data` axis and the training state replicated (or, with
shard_optimizer, the optimizer state split too: ZeRO-1); XLA's SPMD partitioner inserts the
gradient all-reduce. Each process drives its own devices; with several processes (hosts),
jax.distributed joins them into one global mesh, process by process.
"""

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

AXIS = 'data'


class MeshError(ValueError):
  """Bad input about devices or processes: one line, exit status 2."""


@dataclasses.dataclass(frozen=True)
class Hosts:
  """How this process joins others (--coordinator_address, --num_processes, --process_id)."""

  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None


def _env_int(environ: Mapping[str, str], name: str) -> int:
  try:
    return int(environ[name])
  except ValueError:
    raise MeshError(f'{name}={environ[name]!r} is not a whole number') from None


def distributed_args(hosts: Hosts, environ: Mapping[str, str]) -> dict[str, Any] | None:
  """jax.distributed.initialize's arguments for this process; None: one process alone.

  The flags come first; without them, JAX_COORDINATOR_ADDRESS (with JAX_NUM_PROCESSES and
  JAX_PROCESS_ID, or a Kubernetes indexed job's JOB_COMPLETION_INDEX), or a SLURM step of
  several tasks, whose variables JAX reads itself. A plain host has none of them.
  """
  given = {k: v for k, v in dataclasses.asdict(hosts).items() if v is not None}
  if not given and environ.get('JAX_COORDINATOR_ADDRESS'):
    given['coordinator_address'] = environ['JAX_COORDINATOR_ADDRESS']
    if environ.get('JAX_NUM_PROCESSES'):
      given['num_processes'] = _env_int(environ, 'JAX_NUM_PROCESSES')
    for name in ('JAX_PROCESS_ID', 'JOB_COMPLETION_INDEX'):
      if environ.get(name):
        given['process_id'] = _env_int(environ, name)
        break
  slurm = ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_PROCID', 'SLURM_LOCALID')
  if not given and all(k in environ for k in slurm) and environ.get('SLURM_NTASKS', '1') != '1':
    return {}
  if not given:
    return None
  n, i = given.get('num_processes'), given.get('process_id')
  if n is not None and i is not None and i >= n:
    raise MeshError(f'process id {i} is not below the process count {n}')
  return given


def visible_gpus(environ: Mapping[str, str]) -> int | None:
  """How many GPUs this process may use, read without starting JAX; None: no GPU."""
  if environ.get('JAX_PLATFORMS', '').lower() == 'cpu':
    return None
  listed = environ.get('CUDA_VISIBLE_DEVICES')
  if listed is not None:
    return len([x for x in listed.split(',') if x.strip()]) or None
  if not shutil.which('nvidia-smi'):
    return None
  try:
    out = subprocess.run(['nvidia-smi', '-L'], capture_output=True, text=True, timeout=30).stdout
  except (subprocess.SubprocessError, OSError):
    return None
  return sum(line.startswith('GPU ') for line in out.splitlines()) or None


def start(devices: str, hosts: Hosts, environ: Mapping[str, str] = os.environ) -> None:
  """Before the backend starts: show JAX only the GPUs in use, and join the other processes.

  A GPU that JAX sees gets its memory preallocated; with --devices below the GPU count the
  others stay hidden, so that other processes can use them.
  """
  gpus = visible_gpus(environ)
  ids = None
  if devices != 'all' and gpus is not None:
    if int(devices) > gpus:
      raise MeshError(f'--devices={devices}: this host has {gpus} GPU{"s" * (gpus != 1)}')
    if int(devices) < gpus:
      ids = list(range(int(devices)))
  kwargs = distributed_args(hosts, environ)
  if kwargs is None:
    if ids is not None:
      jax.config.update('jax_cuda_visible_devices', ','.join(map(str, ids)))
    return
  if ids is not None:
    kwargs['local_device_ids'] = ids
  if gpus is None:  # processes on CPUs reach each other's devices through gloo
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  try:
    jax.distributed.initialize(**kwargs)
  except (ValueError, TypeError, RuntimeError) as e:
    text = str(e).strip().splitlines()
    raise MeshError(
      f'jax.distributed.initialize: {text[0] if text else type(e).__name__}'
    ) from None


def local_count(devices: str) -> int:
  """The number of this process's devices that --devices asks for (the backend starts, but
  for --devices=1)."""
  if devices == '1':
    return 1
  have = jax.local_device_count()
  if devices == 'all':
    return have
  if int(devices) > have:
    kind = jax.local_devices()[0].platform.upper()
    raise MeshError(
      f'--devices={devices}: this process has {have} {kind} device{"s" * (have != 1)}'
    )
  return int(devices)


def check_batch(examples: int, per_process: int) -> None:
  """A fixed batch splits evenly over the devices of every process, or MeshError."""
  total = per_process * (jax.process_count() if jax.distributed.is_initialized() else 1)
  if examples % total:
    raise MeshError(
      f'{examples} examples do not split evenly over {total} devices: give a multiple of '
      f'{total} examples'
    )


def plan(devices: str, batch_size: int | None, sizes: dict[str, int], cards: bool) -> int:
  """--devices as a count of this process's devices, checked against the rest of the command:
  no card emulated or predicted (`cards`), a --batch_size that splits evenly over the devices of
  every workload (`sizes`: a name's example size, in its unit)."""
  if devices != '1' and cards:
    raise MeshError('--devices runs on this host\'s devices: not with a card to emulate or predict')
  n = local_count(devices)
  for name, size in sizes.items() if batch_size is not None else ():
    try:
      check_batch(batch_size // size, n)
    except MeshError as e:
      raise MeshError(f'--batch_size={batch_size} of {name}: {e}') from None
  return n


def _in_optimizer(path) -> bool:
  return any('opt_state' in (getattr(k, 'name', None), getattr(k, 'key', None)) for k in path)


class Layout:
  """Where the step's arrays live: the batch split over `data`, the state replicated."""

  def __init__(self, devices: list[Any], shard_optimizer: bool = False):
    self.mesh = jax.sharding.Mesh(np.array(devices), (AXIS,))
    self.shard_optimizer = shard_optimizer

  @classmethod
  def local(cls, n: int, shard_optimizer: bool = False) -> 'Layout':
    """Each process's first n devices, process after process."""
    by_process: dict[int, list[Any]] = {}
    for d in jax.devices():
      by_process.setdefault(d.process_index, []).append(d)
    devices = [d for p in sorted(by_process) for d in sorted(by_process[p], key=lambda d: d.id)[:n]]
    return cls(devices, shard_optimizer)

  @property
  def size(self) -> int:
    return self.mesh.size

  def sharding(self, *spec) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(*spec))

  def batch(self, shapes, examples: int):
    """Leaves with `examples` rows split by rows; any other leaf replicated."""
    return jax.tree.map(
      lambda x: self.sharding(AXIS) if x.ndim and x.shape[0] == examples else self.sharding(),
      shapes,
    )

  def state(self, shapes):
    """Replicated; with shard_optimizer, each optimizer leaf split along its first axis that
    divides evenly (a leaf with none stays replicated)."""

    def leaf(path, x):
      if self.shard_optimizer and _in_optimizer(path):
        for axis, d in enumerate(x.shape):
          if d % self.size == 0 and d >= self.size:
            return self.sharding(*([None] * axis), AXIS)
      return self.sharding()

    return jax.tree_util.tree_map_with_path(leaf, shapes)

  def key(self, seed: int):
    """The PRNG key of `seed`, replicated on the mesh (made there: no host transfer)."""
    return jax.jit(lambda: jax.random.key(seed), out_shardings=self.sharding())()

  def topology(self) -> dict[str, Any]:
    """What the result records of the devices and processes it ran on."""
    local = [d for d in self.mesh.devices.flat if d.process_index == jax.process_index()]
    return {
      'processes': jax.process_count(),
      'process_id': jax.process_index(),
      'local_devices': len(local),
      'global_devices': self.size,
      'device_kind': local[0].device_kind,
      'shard_optimizer': self.shard_optimizer,
    }


def abstract(shapes, shardings):
  """ShapeDtypeStructs of `shapes` that carry `shardings`: what a sharded step is lowered for."""
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings
  )
