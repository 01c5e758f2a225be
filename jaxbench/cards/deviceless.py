"""--compile_for: XLA's memory forecast for a GPU, compiled on a host that has none.

JAX compiles ahead of time for a device it describes but does not have (a "topology"): with
JAX's CUDA plugin installed, XLA's GPU compiler runs on the CPU from a target description of
the GPU (jaxbench/data/targets/NAME.txtpb) and plans the program's memory as it would there.
`--predict --compile_for=h200` thus gives the max-batch table from any machine, with no GPU
time spent. One thing differs from a compile on the GPU: nothing is autotuned, so each matmul
and convolution keeps XLA's default algorithm, and the workspace it plans for it can differ
from the one the GPU's autotuner picks. Against an H200's own forecasts: BERT-base identical or
within 3 KB at most batches, up to 29 MB below at others (2% at one sequence); yolov3 and
deeplabv3 up to 152 MB off (0.06-0.11% near 142 GB).

This module starts no JAX until `device` is called, so that flags can be checked first.
"""

import os
from typing import Any

_HERE = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'data', 'targets')
TARGETS = {'h200': 'h200.txtpb'}  # name -> XLA GPU target description


class DevicelessError(RuntimeError):
  pass


def check(name: str) -> str:
  """The target's name, or a ValueError that lists the known ones."""
  if name not in TARGETS:
    raise ValueError(f'--compile_for: unknown target {name!r}; known: {", ".join(sorted(TARGETS))}')
  return name


def prepare() -> None:
  """Before the backend starts: the host runs on its CPU (the GPU exists only as a target).

  Through JAX's config as well as the environment: JAX reads JAX_PLATFORMS once, when it is
  imported, and a run imports it before this (jaxbench.core.mesh). Without it JAX's CUDA plugin
  checks the CUDA driver as it starts, fails on a host without a GPU, and the target is lost."""
  os.environ['JAX_PLATFORMS'] = 'cpu'
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update('jax_platforms', 'cpu')


def start(name: str | None) -> None:
  """A benchmark's --compile_for before JAX starts: the target checked (a ValueError that lists
  the known ones) and, if one is named, the host put on its CPU."""
  if name is not None:
    check(name)
    prepare()


def device(name: str) -> Any:
  """The described GPU as a JAX device to compile for (it runs nothing)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  with open(os.path.join(_HERE, TARGETS[check(name)])) as f:
    target = f.read()
  try:
    topology = topologies.get_topology_desc(platform='cuda', topology='1x1x1', target_config=target)
  except Exception as e:  # pylint: disable=broad-except
    first = (str(e).strip().splitlines() or [''])[0][:200]
    raise DevicelessError(
      f"--compile_for={name} needs JAX's CUDA plugin (pip install -e '.[cuda]'; "
      f'no GPU needed): {type(e).__name__}: {first}'
    ) from None
  return topology.devices[0]


def device_info(dev: Any) -> dict[str, Any]:
  """What a result records as its device: the target's kind, marked as compiled-for only."""
  return {
    'platform': 'gpu',
    'kind': dev.device_kind,
    'count': 1,
    'pool_bytes': None,
    'deviceless': True,
  }


def abstract(tree: Any, dev: Any) -> Any:
  """Shapes and dtypes of `tree`, placed on `dev` (what a deviceless lowering takes)."""
  import jax  # pylint: disable=g-import-not-at-top

  sharding = jax.sharding.SingleDeviceSharding(dev)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)
