"""Images for --data=tfds: each original's preprocessing of one TFDS record to one example at
the workload's static shapes (NumPy, on the host): ImageNet for nasnet_large, COCO for yolov3,
mask_rcnn and (as VOC's classes) deeplabv3, CelebA-HQ for stylegan, Cityscapes for pix2pixhd.
"""

from __future__ import annotations

import math

import numpy as np

Example = dict[str, np.ndarray]


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


def imagenet(record, cfg, rng) -> Example:
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


def coco(record, cfg, rng) -> Example:
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


def celeba_hq(record, cfg, rng) -> Example:
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


def cityscapes(record, cfg, rng) -> Example:
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


def mask_rcnn(record, cfg, rng) -> Example:
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


def voc_from_coco(record, cfg, rng) -> Example:
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
