"""What each workload reads with --data=tfds: its original's TFDS dataset, and the original's
preprocessing of one record to one example at the workload's static shapes (NumPy, on the host).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxbench.train import image_examples, text_examples

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


HASHED = 'words hashed into the vocabulary (CRC32), a stand-in for the original tokenizer'
RECIPES: dict[str, Recipe] = {
  'nasnet_large': Recipe(
    'imagenet2012',
    'train',
    image_examples.imagenet,
    'random crop (5-100% of the area, aspect 3/4-4/3) resized bilinearly to image_size, random '
    'flip, pixels in [-1, 1] (slim inception preprocessing without its colour distortion)',
  ),
  # The version named: TFDS then reads the prepared files without the builder's code, which
  # imports TensorFlow.
  'yolov3': Recipe(
    'coco/2017:1.1.0',
    'train',
    image_examples.coco,
    'the whole image resized to image x image, random flip, pixels in [0, 1], up to max_boxes '
    'non-crowd boxes in random order as (cx, cy, w, h) (darknet without jitter and HSV)',
  ),
  # COCO's instance masks are polygons TFDS does not keep: the panoptic PNGs hold the masks.
  'mask_rcnn': Recipe(
    'coco/2017_panoptic:1.1.0',
    'train',
    image_examples.mask_rcnn,
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
    image_examples.voc_from_coco,
    'COCO panoptic as VOC semantic segmentation (VOC 2012 augmented is not in TFDS with masks): '
    "the 20 COCO categories that are VOC's classes as those, every other category background "
    '0, unlabelled pixels 255; random scale 0.5-2.0 (step 0.25), padded with the mean pixel '
    'and 255 to the crop, random crop, random flip, pixels in [-1, 1]',
  ),
  # StyleGAN's FFHQ is not in TFDS: CelebA-HQ, its other 1024x1024 face set, stands in.
  'stylegan': Recipe(
    'celeb_a_hq/1024',
    'train',
    image_examples.celeba_hq,
    'CelebA-HQ (FFHQ is not in TFDS; a manual download) at the resolution (box filter down), '
    'random left-right flip (mirror augment), pixels in [-1, 1]',
  ),
  'pix2pixhd': Recipe(
    'cityscapes/semantic_segmentation',
    'train',
    image_examples.cityscapes,
    'label map resized nearest, image bilinearly in [-1, 1], random flip; TFDS has no instance '
    'ids, so the instance edges are the label boundaries and the features one random vector '
    'per class',
  ),
  'bert_base': Recipe(
    'wikipedia/20230601.en',
    'train',
    text_examples.bert_pretraining,
    '[CLS] sentence [SEP] next or random sentence [SEP] (50/50, the NSP label), 15% of the '
    f'tokens up to masked predicted (80% [MASK], 10% random, 10% kept); {HASHED}',
    others=1,
  ),
  'bert_squad': Recipe(
    'squad/v1.1',
    'train',
    text_examples.squad,
    f'[CLS] question [SEP] context window [SEP], the answer span in tokens; {HASHED}',
  ),
  'transformer_big': Recipe(
    'wmt16_translate/de-en',
    'train',
    text_examples.translation('en', 'de', ('vocab', 'vocab')),
    f'English to German, each sentence cut to its length, EOS, padded; {HASHED}',
  ),
  'conv_seq2seq': Recipe(
    'wmt14_translate/de-en',
    'train',
    text_examples.translation('en', 'de', ('src_vocab', 'tgt_vocab')),
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
      (
        language,
        Recipe('wmt14_translate/fr-en', 'train', text_examples.monolingual(language), '', reads=2),
      )
      for language in ('en', 'fr')
    ),
    combine=text_examples.xlm_batch,
  ),
  'mt_dnn': Recipe(
    'glue',
    'train',
    None,
    f'[CLS] a [SEP] b [SEP], the longer sentence cut first, per GLUE task; {HASHED}',
    parts=tuple(
      (task, Recipe(f'glue/{config}', 'train', text_examples.glue(fields, task == 'stsb'), ''))
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
