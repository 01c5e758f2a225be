"""The PyTorch peers by workload name: explicit imports and one dict that refuses duplicates."""

from models.pytorch import (
  bert,
  conv_seq2seq,
  deeplab,
  mask_rcnn,
  mt_dnn,
  nasnet,
  pix2pixhd,
  stylegan,
  transformer,
  unsupmt,
  yolo,
)
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


# In the order of models/registry.py.
_register(transformer.TRANSFORMER_BIG)
_register(conv_seq2seq.CONV_SEQ2SEQ)
_register(bert.BERT_BASE, bert.BERT_SQUAD)
_register(mt_dnn.MT_DNN)
_register(unsupmt.UNSUPMT)
_register(deeplab.DEEPLABV3)
_register(yolo.YOLOV3)
_register(nasnet.NASNET_LARGE)
_register(stylegan.STYLEGAN)
_register(pix2pixhd.PIX2PIXHD)
_register(mask_rcnn.MASK_RCNN)
