"""The workload registry: explicit imports and one dict that refuses duplicates."""

from models import bert, transformer
from models import workload as wl
from models.conv_seq2seq import fconv
from models.deeplab import deeplab
from models.mask_rcnn import mask_rcnn
from models.mt_dnn import mt_dnn
from models.nasnet import nasnet
from models.pix2pixhd import pix2pixhd
from models.stylegan import stylegan
from models.unsupmt import xlm
from models.yolo import yolo

_REGISTRY: dict[str, wl.Workload] = {}


def _register(*workloads: wl.Workload) -> None:
  for w in workloads:
    if w.name in _REGISTRY:
      raise ValueError(f'workload {w.name!r} registered twice')
    _REGISTRY[w.name] = w


# One line per model family; keep the 2020 benchmark's order within each.
_register(transformer.TRANSFORMER_BIG)
_register(fconv.FCONV_WMT_EN_DE)
_register(bert.BERT_BASE, bert.BERT_SQUAD)
_register(mt_dnn.MT_DNN)
_register(xlm.UNSUPMT)
_register(deeplab.DEEPLABV3)
_register(yolo.YOLOV3)
_register(nasnet.NASNET_LARGE)
_register(stylegan.STYLEGAN)
_register(pix2pixhd.PIX2PIXHD)
_register(mask_rcnn.MASK_RCNN)


def names() -> list[str]:
  return sorted(_REGISTRY)


def get(name: str) -> wl.Workload:
  """The workload called `name`; an unknown name lists the valid ones."""
  try:
    return _REGISTRY[name]
  except KeyError:
    raise KeyError(f'unknown model {name!r}; valid models: {", ".join(names())}') from None


def all_workloads() -> list[wl.Workload]:
  return [_REGISTRY[n] for n in names()]
