"""The GPU catalog (jaxbench/data/gpus.csv) and the memory a card of each size leaves to XLA.

A card's memory is its vendor figure in binary gigabytes (an "11 GB" RTX 2080 Ti carries
11 GiB = 11264 MiB of GDDR6). Not all of it reaches the framework's allocator:

- the driver reserves some of it: nvidia-smi reports less than the chips hold (RTX 2080 Ti:
  11019 of 11264 MiB, 245 MiB short; V100 16GB: 16160 of 16384; A100 40GB: 40536 of 40960);
- the process's CUDA context, with cuBLAS and cuDNN loaded and their handles created, holds a
  few hundred MiB more before the first tensor (what nvidia-smi shows for a PyTorch or
  TensorFlow process that has allocated nothing).

Both are modelled by one constant, CARD_OVERHEAD_BYTES. Workspaces of cuBLAS and cuDNN are not
in it: XLA (and the 2020 frameworks) take them from the allocator's pool, so a program's
predicted peak already counts them. Emulating a card on a larger one caps the allocator's pool
at card memory - overhead; the larger card's own context lives outside that pool.
"""

import csv
import dataclasses
import functools
import importlib.resources

MIB = 2**20
GIB = 2**30
# The driver's reservation (about 256 MiB: the gap between chip size and nvidia-smi's
# memory.total) plus the CUDA context with cuBLAS/cuDNN loaded (about 512 MiB).
DRIVER_RESERVED_BYTES = 256 * MIB
CONTEXT_BYTES = 512 * MIB
CARD_OVERHEAD_BYTES = DRIVER_RESERVED_BYTES + CONTEXT_BYTES

# Named sets of GPUs for --gpus.
LAMBDA2020 = 'lambda2020'


class CatalogError(ValueError):
  """An unknown GPU name or set; the message lists the valid ones."""


@dataclasses.dataclass(frozen=True)
class Gpu:
  """One card of the catalog, or a raw memory size (name 'mem_<N>gb')."""

  name: str
  display: str
  memory_gb: float  # vendor figure, in GiB (2**30 bytes)
  price_usd_2020: float | None = None
  released: int | None = None
  note: str = ''

  @property
  def memory_bytes(self) -> int:
    return int(round(self.memory_gb * GIB))

  @property
  def overhead_bytes(self) -> int:
    return CARD_OVERHEAD_BYTES

  @property
  def cap_bytes(self) -> int:
    """What XLA's allocator may use on a real card of this size: memory - overhead."""
    return self.memory_bytes - self.overhead_bytes

  def emulation(self) -> dict:
    """How this card is emulated, as recorded in each result."""
    return {
      'gpu': self.name,
      'display': self.display,
      'memory_gb': self.memory_gb,
      'memory_bytes': self.memory_bytes,
      'overhead_bytes': self.overhead_bytes,
      'cap_bytes': self.cap_bytes,
    }


@functools.cache
def _load() -> dict[str, Gpu]:
  text = importlib.resources.files('jaxbench').joinpath('data/gpus.csv').read_text()
  gpus = {}
  for row in csv.DictReader(text.splitlines()):
    gpu = Gpu(
      name=row['name'],
      display=row['display'],
      memory_gb=float(row['memory_gb']),
      price_usd_2020=float(row['price_usd_2020']) if row['price_usd_2020'] else None,
      released=int(row['released']) if row['released'] else None,
      note=row['note'],
    )
    if gpu.name in gpus:
      raise ValueError(f'gpus.csv lists {gpu.name!r} twice')
    gpus[gpu.name] = gpu
  return gpus


def names() -> list[str]:
  """Catalog names in catalog order (the eight 2020 GPUs first, then by release)."""
  return list(_load())


def all_gpus() -> list[Gpu]:
  return list(_load().values())


def get(name: str) -> Gpu:
  try:
    return _load()[name]
  except KeyError:
    raise CatalogError(f'unknown GPU {name!r}; valid GPUs: {", ".join(names())}') from None


def by_display(display: str) -> Gpu:
  """The catalog card whose display name is `display` (as lambda2020.csv spells it)."""
  for gpu in _load().values():
    if gpu.display == display:
      return gpu
  raise CatalogError(f'no catalog GPU is displayed as {display!r}')


# What a driver's device kind adds to a card's name: the maker, the product line, and for some
# cards the memory or the bus ('NVIDIA GeForce RTX 4090', 'NVIDIA H100 80GB HBM3',
# 'NVIDIA A100 80GB PCIe'); none of them tells two catalog cards apart.
_KIND_PREFIXES = ('NVIDIA ', 'GeForce ')
_KIND_SUFFIXES = (' HBM3', ' HBM2e', ' PCIe')


def of_device(kind: str) -> str | None:
  """The name of the catalog card a device kind names ('NVIDIA H200' -> 'h200', 'NVIDIA H100
  80GB HBM3' -> 'h100_80'), or None."""
  for prefix in _KIND_PREFIXES:
    kind = kind.removeprefix(prefix)
  for suffix in _KIND_SUFFIXES:
    kind = kind.removesuffix(suffix)
  try:
    return by_display(kind).name
  except CatalogError:
    return None


def lambda2020() -> list[Gpu]:
  """The eight GPUs of the 2020 benchmark (those with a 2020 price)."""
  return [g for g in _load().values() if g.price_usd_2020 is not None]


def raw(memory_gb: float) -> Gpu:
  """A card of `memory_gb` GB (1e9 bytes, not GiB) that is not in the catalog (--memory_gb).

  It loses the same overhead as a catalog card. Its memory_gb field, like every card's, is in
  GiB: a 16 GB card records 14.9 GiB and 16e9 bytes.
  """
  gpu = Gpu(
    name=f'mem_{memory_gb:g}gb', display=f'{memory_gb:g} GB card', memory_gb=memory_gb * 1e9 / GIB
  )
  if gpu.cap_bytes <= 0:
    raise CatalogError(
      f'--memory_gb={memory_gb:g} leaves nothing after the '
      f'{CARD_OVERHEAD_BYTES / MIB:.0f} MiB a card loses to CUDA and the driver'
    )
  return gpu


def resolve(spec: list[str]) -> list[Gpu]:
  """A --gpus list: catalog names and/or 'lambda2020' (the 2020 set), duplicates dropped."""
  out: dict[str, Gpu] = {}
  for item in spec:
    if item != LAMBDA2020 and item not in _load():
      raise CatalogError(
        f'unknown GPU {item!r}; valid GPUs: {LAMBDA2020} (the 2020 eight), {", ".join(names())}'
      )
    for gpu in lambda2020() if item == LAMBDA2020 else [get(item)]:
      out.setdefault(gpu.name, gpu)
  if not out:
    raise CatalogError(f'--gpus names no GPU; valid: {LAMBDA2020}, {", ".join(names())}')
  return list(out.values())
