"""What each workload reads with --data=tfds: its original's TFDS dataset, and the original's
preprocessing of one record to one example at the workload's static shapes (NumPy, on the host).
"""

from __future__ import annotations

import dataclasses
import math
import re
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from models.unsupmt import noise as xlm_ids

Example = dict[str, np.ndarray]


class DataError(Exception):
  """A data source that cannot be opened: one line saying why and what to do."""


@dataclasses.dataclass(frozen=True)
class Recipe:
  """Where a workload's real examples come from and how one record becomes one example."""

  dataset: str  # the TFDS name, with its config
  split: str
  example: Callable[[Mapping[str, Any], Mapping[str, Any], np.random.Generator], Example]
  preprocessing: str  # in words, for the record and --help
  # A batch of one sub-batch per part, each part its own dataset (MT-DNN's GLUE tasks) or its
  # own order of one (XLM's English and French streams).
  parts: tuple[tuple[str, Recipe], ...] = ()
  # The parts' sub-batches ({part: sub-batch}) to the workload's batch; None: that dict itself.
  combine: Callable[[dict[str, Example]], Any] | None = None
  # Records a part reads per example of the batch (XLM's two sub-steps in each language).
  reads: int = 1
  # Other records, drawn at random, that each example reads after its own (BERT's random next
  # sentence): the example's first argument is then the tuple (record, *others).
  others: int = 0


# ImageNet, as slim's inception preprocessing trains NASNet.


def _crop_box(h: int, w: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
  """A random box of 5% to 100% of the image's area and aspect ratio 3/4 to 4/3 (slim's
  distorted_bounding_box_crop); the whole image when ten draws do not fit."""
  for _ in range(10):
    area = rng.uniform(0.05, 1.0) * h * w
    ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
    cw, ch = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
    if 0 < cw <= w and 0 < ch <= h:
      x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
      return x, y, x + cw, y + ch
  return 0, 0, w, h


def crop_resize_flip(image: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
  """A random crop resized bilinearly to size x size, flipped left-right at random, in [-1, 1]."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  h, w = image.shape[:2]
  pixels = np.asarray(
    Image.fromarray(image[..., :3]).resize(
      (size, size), Image.Resampling.BILINEAR, box=_crop_box(h, w, rng)
    ),
    np.float32,
  )
  if rng.random() < 0.5:
    pixels = pixels[:, ::-1]
  return pixels * (2.0 / 255.0) - 1.0


def _imagenet(record, cfg, rng) -> Example:
  image = np.asarray(record['image'])
  if image.ndim == 2 or image.shape[-1] == 1:
    image = np.repeat(image.reshape(*image.shape[:2], 1), 3, axis=-1)
  # Slim's 1001 classes keep 0 for the background: TFDS's label l is class l + 1 (a smaller
  # --set num_classes wraps the labels onto its classes).
  label = (int(record['label']) + 1) % cfg['num_classes']
  return {
    'images': crop_resize_flip(image, cfg['image_size'], rng),
    'labels': np.int32(label),
  }


def _coco(record, cfg, rng) -> Example:
  """darknet's detection input without its jitter and HSV distortion: the whole image resized
  to image x image, flipped left-right at random, pixels in [0, 1]; the boxes (crowd regions
  and empty boxes dropped) in random order, the first max_boxes as (cx, cy, w, h) fractions."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  size, m = cfg['image'], cfg['max_boxes']
  image = np.asarray(record['image'])
  if image.ndim == 2 or image.shape[-1] == 1:
    image = np.repeat(image.reshape(*image.shape[:2], 1), 3, axis=-1)
  pixels = np.asarray(
    Image.fromarray(image[..., :3]).resize((size, size), Image.Resampling.BILINEAR), np.float32
  )
  objects = record['objects']
  ymin, xmin, ymax, xmax = np.clip(np.asarray(objects['bbox'], np.float32).reshape(-1, 4), 0, 1).T
  labels = np.asarray(objects['label']).reshape(-1)
  keep = (xmax > xmin) & (ymax > ymin)
  if 'is_crowd' in objects:
    keep &= ~np.asarray(objects['is_crowd'], bool).reshape(-1)
  if rng.random() < 0.5:
    pixels = pixels[:, ::-1]
    xmin, xmax = 1.0 - xmax, 1.0 - xmin
  boxes = np.stack([(xmin + xmax) / 2, (ymin + ymax) / 2, xmax - xmin, ymax - ymin], -1)
  order = rng.permutation(np.flatnonzero(keep))[:m]
  k = len(order)
  out_boxes = np.zeros((m, 4), np.float32)
  out_boxes[:k] = boxes[order]
  classes = np.zeros(m, np.int32)
  classes[:k] = labels[order] % cfg['classes']
  return {
    'images': pixels / 255.0,
    'boxes': out_boxes,
    'classes': classes,
    'valid': np.arange(m) < k,
  }


def _celeba_hq(record, cfg, rng) -> Example:
  """StyleGAN's training image: the whole image at the resolution (a box filter down, as
  dataset_tool.py's 2x2 averages per halving; bilinear up), flipped left-right half the time
  (--mirror-augment), pixels in [-1, 1]."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  size = cfg['resolution']
  image = np.asarray(record['image'])
  if image.ndim == 2 or image.shape[-1] == 1:
    image = np.repeat(image.reshape(*image.shape[:2], 1), 3, axis=-1)
  image = image[..., :3]
  if image.shape[:2] != (size, size):
    down = image.shape[0] >= size and image.shape[1] >= size
    resample = Image.Resampling.BOX if down else Image.Resampling.BILINEAR
    image = np.asarray(Image.fromarray(image).resize((size, size), resample))
  pixels = image.astype(np.float32)
  if rng.random() < 0.5:
    pixels = pixels[:, ::-1]
  return {'images': pixels * (2.0 / 255.0) - 1.0}


def _cityscapes(record, cfg, rng) -> Example:
  """pix2pixHD's training pair at height x width: the label map resized nearest (ids of label_nc
  and above wrap onto its classes), the image bilinearly in [-1, 1], both flipped left-right
  half the time (its default without --no_flip). TFDS has no instance ids: the label map
  stands in for them, so the step's instance edges are the label boundaries; each class gets
  one random feature vector in [-1, 1] (feat_num channels), constant over its pixels as the
  precomputed --load_features maps are over an instance's."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  h, w, classes = cfg['height'], cfg['width'], cfg['label_nc']
  labels = np.asarray(record['segmentation_label'])
  labels = labels.reshape(labels.shape[:2])
  labels = np.asarray(Image.fromarray(labels).resize((w, h), Image.Resampling.NEAREST))
  labels = labels.astype(np.int32) % classes
  image = np.asarray(record['image_left'])[..., :3]
  pixels = np.asarray(Image.fromarray(image).resize((w, h), Image.Resampling.BILINEAR), np.float32)
  if rng.random() < 0.5:
    labels, pixels = labels[:, ::-1], pixels[:, ::-1]
  features = rng.uniform(-1.0, 1.0, (classes, cfg['feat_num'])).astype(np.float32)
  labels = np.ascontiguousarray(labels)
  return {
    'label': labels,
    'instance': labels.copy(),
    'feature': features[labels],
    'image': np.ascontiguousarray(pixels) * (2.0 / 255.0) - 1.0,
  }


# COCO panoptic (coco/2017_panoptic): each pixel's segment id is R + 256 G + 256^2 B of the
# panoptic PNG, and panoptic_objects lists the segments (id, label, is_crowd). Its labels are
# the 133 panoptic categories in COCO's id order: the 80 things (ids 1-90) first, then the 53
# stuff categories (ids 92-200), so label l < 80 is the l-th thing, maskrcnn-benchmark's
# contiguous class l + 1.
COCO_THINGS = 80
COCO_THING_IDS = (
  *range(1, 12), *range(13, 26), 27, 28, *range(31, 45), *range(46, 66), 67, 70,
  *range(72, 83), *range(84, 91),
)  # fmt: skip
# The COCO things that are PASCAL VOC's 20 classes, by COCO id, in VOC's class order
# (aeroplane, bicycle, bird, boat, bottle, bus, car, cat, chair, cow, dining table, dog, horse,
# motorbike, person, potted plant, sheep, sofa, train, tv monitor).
VOC_FROM_COCO_ID = {
  coco: voc + 1
  for voc, coco in enumerate(
    (5, 2, 16, 9, 44, 6, 3, 17, 62, 21, 67, 18, 19, 4, 1, 64, 20, 63, 7, 72)
  )
}


def _rgb(record) -> np.ndarray:
  image = np.asarray(record['image'])
  if image.ndim == 2 or image.shape[-1] == 1:
    image = np.repeat(image.reshape(*image.shape[:2], 1), 3, axis=-1)
  return image[..., :3]


def panoptic_ids(record, height: int, width: int) -> np.ndarray:
  """Each pixel's segment id (R + 256 G + 256^2 B of the panoptic PNG) at height x width (the
  PNG is the image's size; another size is resized nearest)."""
  png = np.asarray(record['panoptic_image'])[..., :3].astype(np.int64)
  ids = png[..., 0] + 256 * png[..., 1] + 65536 * png[..., 2]
  if ids.shape != (height, width):
    rows = np.arange(height) * ids.shape[0] // height
    ids = ids[rows][:, np.arange(width) * ids.shape[1] // width]
  return ids


def panoptic_segments(record) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The segments' ids, labels and crowd flags, in the record's order."""
  objects = record['panoptic_objects']
  ids, labels, crowd = (np.asarray(objects[k]).reshape(-1) for k in ('id', 'label', 'is_crowd'))
  n = min(len(ids), len(labels), len(crowd))
  return ids[:n].astype(np.int64), labels[:n].astype(np.int64), crowd[:n].astype(bool)


def maskrcnn_size(height: int, width: int, canvas: tuple[int, int]) -> tuple[int, int]:
  """maskrcnn-benchmark's training size (shorter side 800, longer at most 1333), scaled down
  further where it does not fit the canvas (portrait images, aspect ratios past the canvas's)."""
  short, long = min(height, width), max(height, width)
  size = 800
  if long / short * size > 1333:
    size = int(round(1333 * short / long))
  if width < height:
    out_h, out_w = int(size * height / width), size
  else:
    out_h, out_w = size, int(size * width / height)
  if height == short and height == size or width == short and width == size:
    out_h, out_w = height, width
  fit = min(canvas[0] / out_h, canvas[1] / out_w, 1.0)
  return max(1, int(out_h * fit)), max(1, int(out_w * fit))


def _mask_rcnn(record, cfg, rng) -> Example:
  """maskrcnn-benchmark's training input from a COCO panoptic record: the image resized to
  maskrcnn_size bilinearly, BGR minus PIXEL_MEAN, flipped left-right half the time, on the
  canvas's top left (zeros around); each non-crowd thing segment an instance, in the record's
  order, the first max_instances kept: its box (x1, y1, x2, y2; x2 - x1 + 1 pixels wide) the
  segment's, its class 1-80 (wrapping onto 1 .. num_classes - 1), its mask the segment sampled
  at gt_mask_size x gt_mask_size cell centres over its box (the form make_batch's masks take)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  from models.mask_rcnn.data import PIXEL_MEAN  # pylint: disable=g-import-not-at-top

  (canvas_h, canvas_w), g, m = cfg['image_size'], cfg['max_instances'], cfg['gt_mask_size']
  image = _rgb(record)
  h, w = image.shape[:2]
  oh, ow = maskrcnn_size(h, w, (canvas_h, canvas_w))
  pixels = np.asarray(Image.fromarray(image).resize((ow, oh), Image.Resampling.BILINEAR))
  pixels = pixels[..., ::-1].astype(np.float32) - np.asarray(PIXEL_MEAN, np.float32)
  flip = rng.random() < 0.5
  if flip:
    pixels = pixels[:, ::-1]
  images = np.zeros((canvas_h, canvas_w, 3), np.float32)
  images[:oh, :ow] = pixels

  segments = panoptic_ids(record, h, w)
  boxes = np.zeros((g, 4), np.float32)
  classes = np.zeros(g, np.int32)
  masks = np.zeros((g, m, m), np.uint8)
  rx, ry = ow / w, oh / h
  cells = (np.arange(m) + 0.5) / m
  k = 0
  for sid, label, crowd in zip(*panoptic_segments(record)):
    if k == g:
      break
    if crowd or label >= COCO_THINGS:
      continue
    mask = segments == sid
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    if not len(rows):
      continue
    y1, y2, x1, x2 = rows[0], rows[-1], cols[0], cols[-1]
    grid_y = np.minimum(y1 + (cells * (y2 - y1 + 1)).astype(int), y2)
    grid_x = np.minimum(x1 + (cells * (x2 - x1 + 1)).astype(int), x2)
    grid = mask[grid_y][:, grid_x]
    box = np.array([x1 * rx, y1 * ry, (x2 + 1) * rx - 1, (y2 + 1) * ry - 1], np.float32)
    if flip:
      grid = grid[:, ::-1]
      box[0], box[2] = ow - box[2] - 1, ow - box[0] - 1
    boxes[k], masks[k] = box, grid
    classes[k] = 1 + label % (cfg['num_classes'] - 1)
    k += 1
  return {
    'images': images,
    'gt_boxes': boxes,
    'gt_classes': classes,
    'gt_masks': masks,
    'gt_valid': np.arange(g) < k,
  }


def _align_corners(out: int, size: int) -> np.ndarray:
  """Source coordinates of `out` samples over `size` pixels, corners aligned (TF1's resize
  with align_corners=True, as DeepLab's)."""
  return np.arange(out) * ((size - 1) / (out - 1) if out > 1 else 0.0)


def _voc_from_coco(record, cfg, rng) -> Example:
  """DeepLab's VOC training crop from a COCO panoptic record: each pixel's class the VOC class
  of its segment's category (COCO's 20 VOC categories; every other category background 0;
  unlabelled pixels 255), classes past `classes` wrapped onto them; a random scale of 0.5 to
  2.0 in steps of 0.25 (the image bilinearly, the labels nearest, corners aligned), padded to
  at least crop x crop with the mean pixel and 255 on the bottom and right, a random crop x
  crop, flipped left-right half the time, pixels in [-1, 1]."""
  from models.deeplab.deeplab import IGNORE_LABEL  # pylint: disable=g-import-not-at-top

  crop, classes = cfg['crop'], cfg['classes']
  image = _rgb(record).astype(np.float32)
  h, w = image.shape[:2]
  segments = panoptic_ids(record, h, w)
  ids, labels, _ = panoptic_segments(record)
  voc = [
    VOC_FROM_COCO_ID.get(COCO_THING_IDS[label], 0) % classes if label < COCO_THINGS else 0
    for label in labels
  ]
  lookup = dict(zip(ids.tolist(), voc))

  scale = 0.5 + 0.25 * int(rng.integers(7))
  nh, nw = int(h * scale), int(w * scale)
  top, left = (
    int(rng.integers(max(nh, crop) - crop + 1)),
    int(rng.integers(max(nw, crop) - crop + 1)),
  )
  # Only the crop's window of the scaled image is computed (bilinear: rows, then columns).
  ys = _align_corners(nh, h)[top : min(top + crop, nh)]
  xs = _align_corners(nw, w)[left : min(left + crop, nw)]
  y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
  y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
  fy = (ys - y0).astype(np.float32)[:, None, None]
  fx = (xs - x0).astype(np.float32)[None, :, None]
  rows = image[y0] * (1 - fy) + image[y1] * fy
  pixels = np.full((crop, crop, 3), 127.5, np.float32)  # the mean pixel past the image
  pixels[: len(ys), : len(xs)] = rows[:, x0] * (1 - fx) + rows[:, x1] * fx
  nearest = segments[np.round(ys).astype(int)][:, np.round(xs).astype(int)]
  present, where = np.unique(nearest, return_inverse=True)
  classes_of = np.array([lookup.get(s, IGNORE_LABEL) for s in present.tolist()], np.int32)
  padded = np.full((crop, crop), IGNORE_LABEL, np.int32)
  padded[: len(ys), : len(xs)] = classes_of[where.reshape(nearest.shape)]
  if rng.random() < 0.5:
    pixels, padded = pixels[:, ::-1], padded[:, ::-1]
  return {
    'images': np.ascontiguousarray(pixels) * np.float32(2.0 / 255.0) - 1.0,
    'labels': np.ascontiguousarray(padded),
  }


# Text: the originals' tokenizers (BERT's WordPiece vocabulary, fairseq's and XLM's BPE codes)
# are files that are not at hand offline; a word's id is its CRC32 hashed into the vocabulary
# above the reserved ids, the same on every machine.

PAD, CLS, EOS, SEP = 0, 1, 2, 3  # PAD and EOS are the models' own; CLS and SEP BERT's markers
MASK = EOS  # BERT's [MASK]: the id of EOS, which BERT's text never holds
FIRST_WORD = 4
_WORDS = re.compile(r'\w+|[^\w\s]')


def words(text: str) -> list[tuple[str, int, int]]:
  """The words and punctuation marks of `text`, lower-cased, with their character spans."""
  return [(m.group().lower(), m.start(), m.end()) for m in _WORDS.finditer(text)]


def word_id(word: str, vocab: int, first: int = FIRST_WORD) -> int:
  """A word's stand-in token id: its CRC32 in [first, vocab) (the ids below are reserved)."""
  return first + zlib.crc32(word.encode()) % (vocab - first)


def _text(value: Any) -> str:
  return value.decode() if isinstance(value, bytes) else str(value)


def sentence(text: str, vocab: int, length: int) -> np.ndarray:
  """A sentence's ids ending with EOS, cut to `length` and padded with PAD (fairseq's order)."""
  ids = [word_id(w, vocab) for w, _, _ in words(text)][: length - 1] + [EOS]
  return np.array(ids + [PAD] * (length - len(ids)), np.int32)


def _translation(source: str, target: str, vocabs: tuple[str, str]):
  def example(record, cfg, rng) -> Example:
    del rng
    src = sentence(_text(record[source]), cfg[vocabs[0]], cfg['src_len'])
    tgt = sentence(_text(record[target]), cfg[vocabs[1]], cfg['tgt_len'])
    # The decoder's input is the target shifted right behind EOS, as fairseq's.
    return {'source': src, 'target': tgt, 'target_in': np.concatenate([[EOS], tgt[:-1]])}

  return example


def _monolingual(language: str):
  """One side of a translation record as an XLM sentence on its own: EOS w1 .. wn EOS PAD ..,
  n cut to seq_len, in XLM's dictionary ids (its EOS, PAD and first word)."""

  def example(record, cfg, rng) -> Example:
    del rng
    length, vocab = cfg['seq_len'], cfg['vocab']
    ids = [word_id(w, vocab, xlm_ids.FIRST_WORD) for w, _, _ in words(_text(record[language]))]
    ids = [xlm_ids.EOS, *ids[:length], xlm_ids.EOS]
    return {'sentence': np.array(ids + [xlm_ids.PAD] * (length + 2 - len(ids)), np.int32)}

  return example


def _xlm_batch(streams: dict[str, Example]) -> Example:
  """2n English and 2n French sentences to XLM's batch: the first n of each language for the
  auto-encoder steps, the next n for back-translation, each stacked [en, fr]."""
  en, fr = streams['en']['sentence'], streams['fr']['sentence']
  n = len(en) // 2
  return {'ae': np.stack([en[:n], fr[:n]]), 'bt': np.stack([en[n:], fr[n:]])}


def _squad(record, cfg, rng) -> Example:
  """[CLS] question [SEP] context window [SEP] with the answer's first and last token, as
  run_squad.py builds a training feature: the question cut to question_len - 2 tokens, the
  context in windows of half the room left, the first window holding the whole answer taken
  (none: the answer points at [CLS], as run_squad.py's windows without it)."""
  del rng
  length, vocab = cfg['seq_len'], cfg['vocab']
  question = [word_id(w, vocab) for w, _, _ in words(_text(record['question']))]
  question = question[: cfg['question_len'] - 2]
  context = words(_text(record['context']))
  answers = record['answers']
  start_char = int(np.asarray(answers['answer_start']).reshape(-1)[0])
  answer = _text(np.asarray(answers['text']).reshape(-1)[0])
  end_char = start_char + max(len(answer), 1)
  inside = [i for i, (_, b, e) in enumerate(context) if b < end_char and e > start_char]
  room = length - len(question) - 3
  first = len(question) + 2  # the context's first position
  start = end = 0
  offset = 0
  if inside:
    stride = max(room // 2, 1)
    offset = next(
      (o for o in range(0, len(context), stride) if o <= inside[0] and inside[-1] < o + room),
      0,
    )
    if offset <= inside[0] and inside[-1] < offset + room:
      start, end = first + inside[0] - offset, first + inside[-1] - offset
  window = [word_id(w, vocab) for w, _, _ in context[offset : offset + room]]
  ids = [CLS, *question, SEP, *window, SEP]
  tokens = np.array(ids + [PAD] * (length - len(ids)), np.int32)
  segments = np.zeros(length, np.int32)
  segments[first : len(ids)] = 1
  return {
    'tokens': tokens,
    'segments': segments,
    'start_positions': np.int32(start),
    'end_positions': np.int32(end),
  }


def pair(first: str, second: str | None, vocab: int, length: int) -> tuple[np.ndarray, ...]:
  """[CLS] a [SEP] (b [SEP]) as BERT's classifiers read them: the longer sentence cut a word at a
  time until both fit (truncate_seq_pair), segment 1 for b, padded with PAD."""
  a = [word_id(w, vocab) for w, _, _ in words(first)]
  b = [word_id(w, vocab) for w, _, _ in words(second)] if second is not None else []
  room = length - (3 if second is not None else 2)
  while len(a) + len(b) > room:
    (a if len(a) >= len(b) else b).pop()
  ids = [CLS, *a, SEP] + ([*b, SEP] if second is not None else [])
  tokens = np.array(ids + [PAD] * (length - len(ids)), np.int32)
  segments = np.zeros(length, np.int32)
  segments[len(a) + 2 : len(ids)] = 1
  return tokens, segments


def _glue(fields: tuple[str, ...], regression: bool = False):
  def example(record, cfg, rng) -> Example:
    del rng
    texts = [_text(record[f]) for f in fields]
    tokens, segments = pair(
      texts[0], texts[1] if len(texts) > 1 else None, cfg['vocab'], cfg['seq_len']
    )
    label = np.float32(record['label']) if regression else np.int32(record['label'])
    return {'tokens': tokens, 'segments': segments, 'labels': label}

  return example


_SENTENCE_END = re.compile(r'(?<=[.!?])\s+|\n+')


def sentences(text: str) -> list[str]:
  """The sentences of `text`: its lines, split after each full stop, question or exclamation
  mark that a space follows; empty ones dropped."""
  return [s for s in (s.strip() for s in _SENTENCE_END.split(text)) if s]


def _bert_pretraining(records, cfg, rng) -> Example:
  """create_pretraining_data.py's example for one sentence pair: a random sentence of the
  article, then 50% its next sentence (label 0) and 50% a random sentence of another article
  (label 1; always where the article has no next); [CLS] a [SEP] b [SEP] cut to seq_len as
  `pair` does; 15% of the tokens (at least one, at most `masked`, never [CLS] or [SEP]) chosen
  for prediction, in position order: 80% replaced by [MASK], 10% by a random word, 10% kept."""
  record, other = records
  vocab, length, masked = cfg['vocab'], cfg['seq_len'], cfg['masked']
  own = sentences(_text(record['text']))
  i = int(rng.integers(len(own))) if own else 0
  first = own[i] if own else ''
  if i + 1 < len(own) and rng.random() < 0.5:
    second, label = own[i + 1], 0
  else:
    theirs = sentences(_text(other['text']))
    second, label = (theirs[int(rng.integers(len(theirs)))] if theirs else ''), 1
  tokens, segments = pair(first, second, vocab, length)
  candidates = np.flatnonzero(tokens >= FIRST_WORD)
  used = int(np.count_nonzero(tokens))
  k = min(masked, max(1, round(used * 0.15)), len(candidates))
  chosen = np.sort(rng.permutation(candidates)[:k])
  originals = tokens[chosen].copy()
  draw = rng.random(k)
  tokens[chosen] = np.where(
    draw < 0.8, MASK, np.where(draw < 0.9, tokens[chosen], rng.integers(FIRST_WORD, vocab, k))
  )
  positions, ids, weights = (np.zeros(masked, t) for t in (np.int32, np.int32, np.float32))
  positions[:k], ids[:k], weights[:k] = chosen, originals, 1.0
  return {
    'tokens': tokens,
    'segments': segments,
    'masked_positions': positions,
    'masked_ids': ids,
    'masked_weights': weights,
    'next_sentence': np.int32(label),
  }


HASHED = 'words hashed into the vocabulary (CRC32), a stand-in for the original tokenizer'
RECIPES: dict[str, Recipe] = {
  'nasnet_large': Recipe(
    'imagenet2012',
    'train',
    _imagenet,
    'random crop (5-100% of the area, aspect 3/4-4/3) resized bilinearly to image_size, random '
    'flip, pixels in [-1, 1] (slim inception preprocessing without its colour distortion)',
  ),
  # The version named: TFDS then reads the prepared files without the builder's code, which
  # imports TensorFlow.
  'yolov3': Recipe(
    'coco/2017:1.1.0',
    'train',
    _coco,
    'the whole image resized to image x image, random flip, pixels in [0, 1], up to max_boxes '
    'non-crowd boxes in random order as (cx, cy, w, h) (darknet without jitter and HSV)',
  ),
  # COCO's instance masks are polygons TFDS does not keep: the panoptic PNGs hold the masks.
  'mask_rcnn': Recipe(
    'coco/2017_panoptic:1.1.0',
    'train',
    _mask_rcnn,
    'shorter side 800, longer at most 1333 (less where the canvas is smaller), bilinear, BGR '
    'minus the pixel mean, random flip, on the canvas; the non-crowd thing segments of the '
    'panoptic PNG as instances (classes 1-80, the first max_instances), each mask sampled on '
    "a grid over its box; panoptic segments do not overlap, where COCO's instance masks may "
    "(an occluded part is the occluder's alone)",
  ),
  # DeepLab's PASCAL VOC 2012 (augmented) is not in TFDS with its masks: COCO panoptic's
  # segments, their categories as VOC's classes, stand in.
  'deeplabv3': Recipe(
    'coco/2017_panoptic:1.1.0',
    'train',
    _voc_from_coco,
    'COCO panoptic as VOC semantic segmentation (VOC 2012 augmented is not in TFDS with masks): '
    "the 20 COCO categories that are VOC's classes as those, every other category background "
    '0, unlabelled pixels 255; random scale 0.5-2.0 (step 0.25), padded with the mean pixel '
    'and 255 to the crop, random crop, random flip, pixels in [-1, 1]',
  ),
  # StyleGAN's FFHQ is not in TFDS: CelebA-HQ, its other 1024x1024 face set, stands in.
  'stylegan': Recipe(
    'celeb_a_hq/1024',
    'train',
    _celeba_hq,
    'CelebA-HQ (FFHQ is not in TFDS; a manual download) at the resolution (box filter down), '
    'random left-right flip (mirror augment), pixels in [-1, 1]',
  ),
  'pix2pixhd': Recipe(
    'cityscapes/semantic_segmentation',
    'train',
    _cityscapes,
    'label map resized nearest, image bilinearly in [-1, 1], random flip; TFDS has no instance '
    'ids, so the instance edges are the label boundaries and the features one random vector '
    'per class',
  ),
  'bert_base': Recipe(
    'wikipedia/20230601.en',
    'train',
    _bert_pretraining,
    '[CLS] sentence [SEP] next or random sentence [SEP] (50/50, the NSP label), 15% of the '
    f'tokens up to masked predicted (80% [MASK], 10% random, 10% kept); {HASHED}',
    others=1,
  ),
  'bert_squad': Recipe(
    'squad/v1.1',
    'train',
    _squad,
    f'[CLS] question [SEP] context window [SEP], the answer span in tokens; {HASHED}',
  ),
  'transformer_big': Recipe(
    'wmt16_translate/de-en',
    'train',
    _translation('en', 'de', ('vocab', 'vocab')),
    f'English to German, each sentence cut to its length, EOS, padded; {HASHED}',
  ),
  'conv_seq2seq': Recipe(
    'wmt14_translate/de-en',
    'train',
    _translation('en', 'de', ('src_vocab', 'tgt_vocab')),
    f'English to German, each sentence cut to its length, EOS, padded; {HASHED}',
  ),
  # XLM trains on monolingual news text: the English and the French sides of WMT14's training
  # pairs are read as two streams, each in its own order, so no batch holds a pair's two sides
  # as such.
  'unsupmt': Recipe(
    'wmt14_translate/fr-en',
    'train',
    None,
    'the English and the French sides as two monolingual streams in their own orders, each '
    f'sentence EOS w1 .. wn EOS cut to seq_len words, padded (XLM without its BPE); {HASHED}',
    parts=tuple(
      (language, Recipe('wmt14_translate/fr-en', 'train', _monolingual(language), '', reads=2))
      for language in ('en', 'fr')
    ),
    combine=_xlm_batch,
  ),
  'mt_dnn': Recipe(
    'glue',
    'train',
    None,
    f'[CLS] a [SEP] b [SEP], the longer sentence cut first, per GLUE task; {HASHED}',
    parts=tuple(
      (task, Recipe(f'glue/{config}', 'train', _glue(fields, task == 'stsb'), ''))
      for task, config, fields in (
        ('mnli', 'mnli', ('premise', 'hypothesis')),
        ('rte', 'rte', ('sentence1', 'sentence2')),
        ('qqp', 'qqp', ('question1', 'question2')),
        ('qnli', 'qnli', ('question', 'sentence')),
        ('mrpc', 'mrpc', ('sentence1', 'sentence2')),
        ('sst', 'sst2', ('sentence',)),
        ('cola', 'cola', ('sentence',)),
        ('stsb', 'stsb', ('sentence1', 'sentence2')),
      )
    ),
  ),
}


def recipe(workload: str) -> Recipe:
  """The recipe of `workload`; DataError naming the wired workloads when it has none."""
  if workload not in RECIPES:
    raise DataError(
      f'--data=tfds: {workload} has no TFDS dataset wired; it reads: '
      + ', '.join(f'{w} ({r.dataset})' for w, r in sorted(RECIPES.items()))
    )
  return RECIPES[workload]
