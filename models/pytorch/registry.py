"""The PyTorch peers by workload name: explicit imports and one dict that refuses duplicates."""

from models.pytorch import mask_rcnn, nasnet, stylegan, transformer, unsupmt
from models.pytorch import peer as peer_lib

_PEERS: dict[str, peer_lib.Peer] = {}


def _register(*peers: peer_lib.Peer) -> None:
  for p in peers:
    if p.name in _PEERS:
      raise ValueError(f'peer {p.name!r} registered twice')
    _PEERS[p.name] = p


def names() -> list[str]:
  return sorted(_PEERS)


def get(name: str) -> peer_lib.Peer:
  """The peer of workload `name`; KeyError naming the workloads that have one."""
  try:
    return _PEERS[name]
  except KeyError:
    raise KeyError(
      f'{name} has no PyTorch peer; workloads with one: {", ".join(names()) or "none"}'
    ) from None


_register(transformer.TRANSFORMER_BIG)
_register(nasnet.NASNET_LARGE)
_register(mask_rcnn.MASK_RCNN)
_register(unsupmt.UNSUPMT)
_register(stylegan.STYLEGAN)
