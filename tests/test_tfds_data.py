"""--data=tfds: training on a workload's TFDS dataset with the original's preprocessing, on
TFDS's mock data and hand-made records; the bad cases are one line and status 2.

tensorflow-datasets is the optional extra `data`: the tests that read through it skip without it.
"""

import importlib
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from jaxbench.train import image_examples, recipes, text_examples, tfds_data
from models import precision, registry
from models.unsupmt import noise as xlm_ids
from tests.test_train import one_line_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The builders that TFDS registers only once their module is imported (mock data needs them).
BUILDERS = {
  'unsupmt': 'tensorflow_datasets.translate.wmt14',
  'bert_base': 'tensorflow_datasets.text.wikipedia',
}
# TFDS's coco builder names TensorFlow's int64 for one feature: with NumPy's in its place, its
# mock data is drawn without TensorFlow.
COCO_WITHOUT_TENSORFLOW = """
import types
import numpy
from tensorflow_datasets.object_detection import coco
coco.tf = types.SimpleNamespace(int64=numpy.int64)
"""
# The command line inside TFDS's mock data: records drawn from each dataset's features.
MOCKED = f"""
import sys
import tensorflow_datasets as tfds
import {', '.join(sorted(set(BUILDERS.values())))}
{COCO_WITHOUT_TENSORFLOW}
from absl import app
from jaxbench import cli, main
with tfds.testing.mock_data(num_examples=int(sys.argv.pop(1)),
                            policy=tfds.testing.MockPolicy.USE_CODE):
  app.run(main.main, flags_parser=cli.flags_parser('jaxbench'))
"""
# The command line with tensorflow-datasets missing, installed or not.
WITHOUT_TFDS = """
import sys
sys.modules['tensorflow_datasets'] = None
from absl import app
from jaxbench import cli, main
app.run(main.main, flags_parser=cli.flags_parser('jaxbench'))
"""


def jaxbench(*args, script=None, timeout=600):
  command = (
    [sys.executable, '-m', 'jaxbench.main'] if script is None else [sys.executable, '-c', script]
  )
  return subprocess.run(
    [*command, *args],
    cwd=ROOT,
    env=os.environ.copy(),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def mocked(records, *args):
  pytest.importorskip('tensorflow_datasets')
  return jaxbench(str(records), *args, script=MOCKED)


def last_record(path):
  with open(path) as f:
    return json.loads(f.read().splitlines()[-1])


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  return f'--compilation_cache_dir={tmp_path_factory.mktemp("compilation_cache")}'


def test_tfds_feeds_training_runs_only():
  one_line_error(
    jaxbench('--model=nasnet_large', '--tiny', '--data=tfds', '--check'), 'give --train_steps'
  )
  one_line_error(
    jaxbench('--model=nasnet_large', '--tiny', '--train_steps=1', '--data_dir=/tmp', '--check'),
    'give --data=tfds',
  )


def test_every_workload_has_a_dataset_and_one_without_lists_those_with_one():
  assert sorted(recipes.RECIPES) == registry.names()
  with pytest.raises(recipes.DataError, match='other has no TFDS dataset wired') as e:
    recipes.recipe('other')
  assert 'nasnet_large (imagenet2012)' in str(e.value) and 'bert_squad (squad/v1.1)' in str(e.value)
  assert 'deeplabv3 (coco/2017_panoptic:1.1.0)' in str(e.value)


def test_without_the_extra_one_line_names_it():
  r = jaxbench(
    '--model=nasnet_large',
    '--tiny',
    '--train_steps=1',
    '--data=tfds',
    '--check',
    script=WITHOUT_TFDS,
  )
  one_line_error(r, "pip install 'jaxbench[data]'")


def test_a_dataset_not_prepared_says_how_to_prepare_it(tmp_path):
  pytest.importorskip('tensorflow_datasets')
  r = jaxbench(
    '--model=bert_squad',
    '--tiny',
    '--train_steps=1',
    '--data=tfds',
    f'--data_dir={tmp_path}',
    '--check',
  )
  one_line_error(r, f'squad/v1.1 (train) is not prepared in {tmp_path}')
  assert 'tfds build squad/v1.1 --file_format=array_record' in r.stderr


def _trained(record, workload, dataset, steps):
  assert record['status'] == 'ok', record['error']
  t = record['train']
  assert t['step'] == steps and all(np.isfinite(loss) for _, loss in t['loss_curve'])
  data = t['data']
  assert (data['source'], data['dataset'], data['position']) == ('tfds', dataset, steps)
  bound = t['input']
  assert bound['real_over_synthetic'] == pytest.approx(
    bound['median_synthetic_step_s'] / bound['median_real_step_s']
  )
  assert bound['input_bound'] == (bound['real_over_synthetic'] < 0.9)
  assert bound['synthetic_steps'] == 20 and bound['median_wait_s'] >= 0


def test_bert_squad_trains_on_mock_squad_and_a_resumed_run_reads_the_uninterrupted_batches(
  tmp_path, cache
):
  run = ('--model=bert_squad', '--tiny', '--batch_size=4', '--log_every=1', '--data=tfds', cache)
  whole, half = tmp_path / 'whole.jsonl', tmp_path / 'half.jsonl'
  # 7 records in batches of 4: the second epoch starts inside the second batch.
  r = mocked(7, *run, '--train_steps=6', f'--output={whole}')
  assert r.returncode == 0, r.stderr
  _trained(last_record(whole), 'bert_squad', 'squad/v1.1', 6)
  assert 'of the synthetic steps/s' in r.stdout and 'the bottleneck' in r.stdout
  ckpt = f'--checkpoint_dir={tmp_path / "ckpt"}'
  assert mocked(7, *run, '--train_steps=3', ckpt).returncode == 0
  r = mocked(7, *run, '--train_steps=6', ckpt, f'--output={half}')
  assert r.returncode == 0, r.stderr
  resumed = last_record(half)['train']
  assert resumed['resumed_from'] == 3 and resumed['data']['position'] == 6
  np.testing.assert_allclose(
    [loss for _, loss in resumed['loss_curve']],
    [loss for _, loss in last_record(whole)['train']['loss_curve']],
    rtol=1e-6,
  )


_SLOW = pytest.mark.slow  # the step's compile: 25-40 s on one core


@pytest.mark.parametrize(
  'model, records, batch, steps, dataset',
  [
    ('bert_base', 5, 4, 2, 'wikipedia/20230601.en'),
    ('stylegan', 4, 4, 2, 'celeb_a_hq/1024'),
    ('pix2pixhd', 3, 2, 2, 'cityscapes/semantic_segmentation'),
    pytest.param('deeplabv3', 3, 2, 2, 'coco/2017_panoptic:1.1.0', marks=_SLOW),
    pytest.param('mask_rcnn', 3, 2, 2, 'coco/2017_panoptic:1.1.0', marks=_SLOW),
    # 16 tokens: two sentences of 6 words and two EOS; greedy generation compiled too
    pytest.param('unsupmt', 5, 16, 2, 'wmt14_translate/fr-en', marks=_SLOW),
  ],
)
def test_each_workload_trains_on_its_mock_dataset(
  tmp_path, cache, model, records, batch, steps, dataset
):
  out = tmp_path / 'r.jsonl'
  r = mocked(
    records,
    f'--model={model}',
    '--tiny',
    f'--batch_size={batch}',
    f'--train_steps={steps}',
    '--data=tfds',
    f'--output={out}',
    cache,
  )
  assert r.returncode == 0, r.stderr
  _trained(last_record(out), model, dataset, steps)


def test_synthetic_checkpoints_are_not_resumed_on_real_data(tmp_path, cache):
  ckpt = f'--checkpoint_dir={tmp_path / "ckpt"}'
  run = ('--model=bert_squad', '--tiny', '--batch_size=4', '--train_steps=2', ckpt, cache)
  assert jaxbench(*run).returncode == 0
  r = mocked(5, *run[:-3], '--train_steps=4', ckpt, '--data=tfds', cache)
  # Found when the checkpoint is read, after the run's first line.
  assert r.returncode == 2, r.stderr
  last = r.stderr.strip().splitlines()[-1]
  assert last.startswith('jaxbench: error: --data=tfds: the checkpoints in '), r.stderr
  assert last.endswith('were trained on synthetic batches') and 'Traceback' not in r.stderr


def _source(workload, records, examples=3, seed=(7, 9)):
  tfds = pytest.importorskip('tensorflow_datasets')
  if workload in BUILDERS:
    importlib.import_module(BUILDERS[workload])
  exec(COCO_WITHOUT_TENSORFLOW, {})
  w = registry.get(workload)
  cfg = w.resolve(tiny=True, overrides={})
  recipe = recipes.recipe(workload)
  with tfds.testing.mock_data(num_examples=records, policy=tfds.testing.MockPolicy.USE_CODE):
    source = tfds_data.source(recipe, cfg, tfds_data.open_records(recipe, None), examples, seed)
  trainer = w.trainer(cfg, precision.get(w.default_precision))
  return source, jax.eval_shape(lambda k: trainer.make_batch(k, examples), jax.random.key(0))


@pytest.mark.parametrize(
  'workload,records',
  [
    ('nasnet_large', 5),
    ('bert_squad', 4),
    ('unsupmt', 5),
    ('bert_base', 5),
    ('stylegan', 4),
    ('pix2pixhd', 4),
    ('mask_rcnn', 4),
    ('deeplabv3', 4),
  ],
)
def test_batches_have_the_synthetic_shapes_and_follow_the_position(workload, records):
  source, shapes = _source(workload, records)
  try:
    first = source.host_batch(1)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), first) == jax.tree.map(
      lambda s: (s.shape, s.dtype), dict(shapes)
    )
    # A resumed run reads what an uninterrupted one would: a batch is its position's alone.
    again, _ = _source(workload, records)
    jax.tree.map(np.testing.assert_array_equal, again.host_batch(1), first)
    again.close()
    other = source.host_batch(2)
    assert any(not np.array_equal(first[k], other[k]) for k in first)
    on_device = source.batch(1)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(on_device), first)
  finally:
    source.close()


def test_every_record_is_read_once_an_epoch():
  source, _ = _source('nasnet_large', 5)
  source.close()
  assert sorted(source._record(k) for k in range(5)) == list(range(5))
  assert sorted(source._record(k) for k in range(5, 10)) == list(range(5))
  assert [source._record(k) for k in range(5)] != [source._record(k) for k in range(5, 10)]


def test_images_are_crops_in_minus_one_to_one():
  rng = np.random.default_rng(0)
  image = np.zeros((40, 60, 3), np.uint8)
  image[:, :30] = 255  # the left half white, the right half black
  pixels = image_examples.crop_resize_flip(image, 16, rng)
  assert pixels.shape == (16, 16, 3) and pixels.dtype == np.float32
  assert pixels.min() >= -1.0 and pixels.max() <= 1.0
  crops = [image_examples.crop_resize_flip(image, 16, rng) for _ in range(8)]
  assert len({c.tobytes() for c in crops}) == 8  # random crops and flips


def test_squad_answer_span_points_at_the_answer_words():
  cfg = dict(seq_len=24, question_len=8, vocab=128)
  context = 'The cat sat on the mat while the dog slept in the warm sun by the door today.'
  record = {
    'question': b'Where did the cat sit?',
    'context': context.encode(),
    'answers': {
      'text': np.array([b'the mat']),
      'answer_start': np.array([context.index('the mat')]),
    },
  }
  ex = recipes.RECIPES['bert_squad'].example(record, cfg, None)
  tokens = ex['tokens']
  assert tokens[0] == text_examples.CLS and tokens.shape == (24,)
  question = [text_examples.word_id(w, 128) for w in ('where', 'did', 'the', 'cat', 'sit', '?')]
  assert list(tokens[1:7]) == question and tokens[7] == text_examples.SEP
  assert list(ex['segments'][:8]) == [0] * 8 and ex['segments'][8] == 1
  start, end = int(ex['start_positions']), int(ex['end_positions'])
  assert list(tokens[start : end + 1]) == [text_examples.word_id(w, 128) for w in ('the', 'mat')]


def test_squad_answer_outside_every_window_points_at_cls():
  cfg = dict(seq_len=12, question_len=4, vocab=64)
  context = ' '.join(f'w{i}' for i in range(40)) + ' answer'
  record = {
    'question': 'q',
    'context': context,
    'answers': {'text': np.array(['w1 w2 w3 w4 w5 w6 w7 w8 w9']), 'answer_start': np.array([3])},
  }
  ex = recipes.RECIPES['bert_squad'].example(record, cfg, None)
  assert int(ex['start_positions']) == 0 and int(ex['end_positions']) == 0


def test_translation_pairs_end_with_eos_and_shift_the_target():
  cfg = dict(src_len=6, tgt_len=5, vocab=50)
  ex = recipes.RECIPES['transformer_big'].example(
    {'en': b'Hello, world!', 'de': b'Hallo Welt, wie geht es dir heute?'}, cfg, None
  )
  ids = [text_examples.word_id(w, 50) for w in ('hello', ',', 'world', '!')]
  assert list(ex['source']) == [*ids, text_examples.EOS, text_examples.PAD]
  assert ex['target'][-1] == text_examples.EOS and text_examples.PAD not in ex['target']  # cut
  assert list(ex['target_in']) == [text_examples.EOS, *ex['target'][:-1]]
  assert all(text_examples.FIRST_WORD <= i < 50 for i in ids)


def _coco_record(rng, boxes, labels, crowd):
  h, w = rng.integers(20, 50, 2)
  return {
    'image': rng.integers(0, 256, (h, w, 3), np.uint8),
    'objects': {
      'bbox': np.array(boxes, np.float32).reshape(-1, 4),
      'label': np.array(labels, np.int64),
      'is_crowd': np.array(crowd, bool),
    },
  }


def test_coco_boxes_become_centre_size_fractions_and_follow_the_flip():
  cfg = dict(image=16, max_boxes=4, classes=80)
  # [ymin, xmin, ymax, xmax]: one box, one crowd region, one empty box.
  record = _coco_record(
    np.random.default_rng(0),
    [[0.1, 0.2, 0.5, 0.3], [0, 0, 1, 1], [0.4, 0.4, 0.4, 0.6]],
    [7, 1, 2],
    [False, True, False],
  )
  seen = set()
  for seed in range(8):
    ex = recipes.RECIPES['yolov3'].example(record, cfg, np.random.default_rng(seed))
    assert ex['images'].shape == (16, 16, 3) and 0 <= ex['images'].min() <= ex['images'].max() <= 1
    assert list(ex['valid']) == [True, False, False, False] and ex['classes'][0] == 7
    cx = float(ex['boxes'][0, 0])
    assert cx == pytest.approx(0.25) or cx == pytest.approx(0.75)  # flipped or not
    np.testing.assert_allclose(ex['boxes'][0, 1:], [0.3, 0.1, 0.4], atol=1e-6)
    seen.add(round(cx, 2))
  assert seen == {0.25, 0.75}


def test_yolov3_batches_from_records_have_the_synthetic_shapes():
  """Any random-access sequence of records feeds the source (TFDS's coco needs TensorFlow for
  its mock data; its ArrayRecord files, once built, do not)."""
  rng = np.random.default_rng(1)
  records = [
    _coco_record(rng, rng.uniform(0, 1, (k, 4)), rng.integers(0, 80, k), np.zeros(k, bool))
    for k in (0, 3, 12)
  ]
  w = registry.get('yolov3')
  cfg = w.resolve(tiny=True, overrides={})
  source = tfds_data.Tfds(recipes.recipe('yolov3'), cfg, records, 4, (3,))
  try:
    batch = jax.device_get(source.batch(0))
  finally:
    source.close()
  trainer = w.trainer(cfg, precision.get(w.default_precision))
  shapes = jax.eval_shape(lambda k: trainer.make_batch(k, 4), jax.random.key(0))
  assert jax.tree.map(lambda a: (a.shape, a.dtype), batch) == jax.tree.map(
    lambda s: (s.shape, s.dtype), dict(shapes)
  )


def test_glue_pairs_cut_the_longer_sentence_first():
  tokens, segments = text_examples.pair('one two three four five', 'six seven', 64, 9)
  ids = lambda text: [text_examples.word_id(w, 64) for w in text.split()]  # noqa: E731
  cls, sep = text_examples.CLS, text_examples.SEP
  assert list(tokens) == [cls, *ids('one two three four'), sep, *ids('six seven'), sep]
  assert list(segments) == [0] * 6 + [1] * 3
  tokens, segments = text_examples.pair('one', None, 64, 5)
  assert list(tokens) == [cls, *ids('one'), sep, 0, 0] and not segments.any()


def test_mt_dnn_batches_hold_every_glue_task_at_the_synthetic_shapes():
  w = registry.get('mt_dnn')
  cfg = w.resolve(tiny=True, overrides={})
  r = recipes.recipe('mt_dnn')
  fields = {
    'mnli': ('premise', 'hypothesis'), 'rte': ('sentence1', 'sentence2'),
    'qqp': ('question1', 'question2'), 'qnli': ('question', 'sentence'),
    'mrpc': ('sentence1', 'sentence2'), 'sst': ('sentence',), 'cola': ('sentence',),
    'stsb': ('sentence1', 'sentence2'),
  }  # fmt: skip
  records = {
    task: [{**{f: f'{task} {f} {i} words' for f in names}, 'label': i % 2} for i in range(3)]
    for task, names in fields.items()
  }
  source = tfds_data.source(r, cfg, records, 2, (5,))
  try:
    batch = jax.device_get(source.batch(0))
    described = source.describe(1)
  finally:
    source.close()
  trainer = w.trainer(cfg, precision.get(w.default_precision))
  shapes = jax.eval_shape(lambda k: trainer.make_batch(k, 2), jax.random.key(0))
  assert jax.tree.map(lambda a: (a.shape, a.dtype), batch) == jax.tree.map(
    lambda s: (s.shape, s.dtype), dict(shapes)
  )
  assert batch['sst']['segments'].sum() == 0 and batch['mnli']['segments'].sum() > 0
  assert described['parts']['stsb']['dataset'] == 'glue/stsb'
  assert described['parts']['sst']['dataset'] == 'glue/sst2'


def test_unsupmt_reads_english_and_french_as_two_streams_in_their_own_orders():
  source, _ = _source('unsupmt', 7, examples=3)
  try:
    batch = source.host_batch(1)
  finally:
    source.close()
  en, fr = source.parts['en'], source.parts['fr']
  sentence = lambda part, k: part.recipe.example(part.records[part._record(k)], part.cfg, None)  # noqa: E731
  # Batch 1 reads records 6..11 of each stream: 3 for the auto-encoder, 3 for back-translation.
  for i in range(3):
    np.testing.assert_array_equal(batch['ae'][0, i], sentence(en, 6 + i)['sentence'])
    np.testing.assert_array_equal(batch['ae'][1, i], sentence(fr, 6 + i)['sentence'])
    np.testing.assert_array_equal(batch['bt'][0, i], sentence(en, 9 + i)['sentence'])
    np.testing.assert_array_equal(batch['bt'][1, i], sentence(fr, 9 + i)['sentence'])
  # The French of a slot is not the English's record: the two streams have their own orders.
  assert [en._record(k) for k in range(7)] != [fr._record(k) for k in range(7)]
  vocab, length = en.cfg['vocab'], en.cfg['seq_len']
  for row in np.concatenate([batch['ae'], batch['bt']]).reshape(-1, length + 2):
    end = list(row).index(xlm_ids.EOS, 1)  # the closing EOS
    assert row[0] == xlm_ids.EOS and (row[end + 1 :] == xlm_ids.PAD).all()
    assert all(xlm_ids.FIRST_WORD <= t < vocab for t in row[1:end])


def test_xlm_sentences_use_xlm_ids_and_are_cut_to_seq_len():
  cfg = dict(seq_len=3, vocab=64)
  record = {'en': b'Yes', 'fr': b'Le chat dort.'}
  parts = dict(recipes.RECIPES['unsupmt'].parts)
  ids = lambda text: [text_examples.word_id(w, 64, xlm_ids.FIRST_WORD) for w in text.split()]  # noqa: E731
  eos, pad = xlm_ids.EOS, xlm_ids.PAD
  fr = parts['fr'].example(record, cfg, None)['sentence']
  assert list(fr) == [eos, *ids('le chat dort'), eos]  # the full stop cut
  en = parts['en'].example(record, cfg, None)['sentence']
  assert list(en) == [eos, *ids('yes'), eos, pad, pad] and en.dtype == np.int32


def test_bert_pretraining_pairs_mask_words_and_label_the_next_sentence():
  cfg = dict(seq_len=16, masked=4, vocab=128)
  article = {'text': 'One two three. Four five six!\nSeven eight nine ten?'}
  other = {'text': 'Alpha beta gamma.'}
  own = text_examples.sentences(article['text'])
  assert own == ['One two three.', 'Four five six!', 'Seven eight nine ten?']
  pairs = {0: {(a, b) for a, b in zip(own, own[1:])}, 1: {(a, 'Alpha beta gamma.') for a in own}}
  example = recipes.RECIPES['bert_base'].example
  labels, kinds = [], []
  for seed in range(60):
    ex = example((article, other), cfg, np.random.default_rng(seed))
    tokens, k = ex['tokens'], int(ex['masked_weights'].sum())
    positions, ids = ex['masked_positions'][:k], ex['masked_ids'][:k]
    restored = tokens.copy()
    restored[positions] = ids
    label = int(ex['next_sentence'])
    # The pair is the article's sentence and its next (0), or another article's sentence (1).
    assert any(
      np.array_equal(restored, text_examples.pair(a, b, 128, 16)[0])
      and np.array_equal(ex['segments'], text_examples.pair(a, b, 128, 16)[1])
      for a, b in pairs[label]
    )
    used = np.count_nonzero(restored)
    assert k == min(4, max(1, round(used * 0.15)))  # 15% of the tokens, up to masked
    assert list(positions) == sorted(set(positions)) and (ids >= text_examples.FIRST_WORD).all()
    assert not ex['masked_positions'][k:].any() and not ex['masked_weights'][k:].any()
    assert (tokens < 128).all() and (ex['masked_ids'] < 128).all()
    labels.append(label)
    kinds += [
      'mask' if t == text_examples.MASK else 'kept' if t == i else 'random'
      for t, i in zip(tokens[positions], ids)
    ]
  # 2/3 random: the last sentence has no next, the others half the time.
  assert 0.5 < np.mean(labels) < 0.8
  assert 0.6 < kinds.count('mask') / len(kinds) < 0.95 and {'kept', 'random'} <= set(kinds)
  alone = {'text': 'Only one sentence here.'}
  assert all(
    example((alone, other), cfg, np.random.default_rng(s))['next_sentence'] == 1 for s in range(5)
  )


def test_stylegan_images_are_box_filtered_flipped_and_in_minus_one_to_one():
  image = np.zeros((32, 32, 3), np.uint8)
  image[:, :14] = 255  # white up to column 14: at 8 x 8, columns 0-2 white, column 3 half
  example = recipes.RECIPES['stylegan'].example
  left = np.array([1, 1, 1, 0, -1, -1, -1, -1], np.float32)
  seen = set()
  for seed in range(8):
    images = example({'image': image}, {'resolution': 8}, np.random.default_rng(seed))['images']
    assert images.shape == (8, 8, 3) and images.dtype == np.float32
    flipped = images[0, 0, 0] < 0
    expected = np.tile(left[::-1] if flipped else left, (8, 1))
    np.testing.assert_allclose(images[:, :, 0], expected, atol=2 / 255)  # one uint8 step
    seen.add(bool(flipped))
  assert seen == {False, True}  # the mirror augmentation
  grey = np.full((4, 6), 51, np.uint8)  # smaller and grey: resized up, three channels
  images = example({'image': grey}, {'resolution': 8}, np.random.default_rng(0))['images']
  np.testing.assert_allclose(images, np.full((8, 8, 3), 51 * 2 / 255 - 1), atol=1e-6)


def test_cityscapes_labels_stay_classes_and_their_boundaries_are_the_instance_edges():
  cfg = dict(height=4, width=8, label_nc=35, feat_num=3)
  labels = np.zeros((8, 16, 1), np.uint8)
  labels[:, :4] = 7  # a road on the left quarter
  labels[4:, 8:] = 36  # an id past label_nc: wraps onto class 1
  image = np.zeros((8, 16, 3), np.uint8)
  image[:, :4] = 255  # white where the road is
  record = {'segmentation_label': labels, 'image_left': image, 'image_id': 'x'}
  example = recipes.RECIPES['pix2pixhd'].example
  seen = set()
  for seed in range(8):
    ex = example(record, cfg, np.random.default_rng(seed))
    flipped = ex['label'][0, -1] == 7
    seen.add(bool(flipped))
    expected = np.zeros((4, 8), np.int32)
    expected[:, :2], expected[2:, 4:] = 7, 1
    expected = expected[:, ::-1] if flipped else expected
    np.testing.assert_array_equal(ex['label'], expected)  # nearest: no blended ids
    np.testing.assert_array_equal(ex['instance'], expected)
    # Bilinear: the road's white blends into the black beside it, where the labels do not.
    image = ex['image'][:, ::-1] if flipped else ex['image']
    assert ex['image'].shape == (4, 8, 3)
    assert (image[:, 0] == 1).all() and (image[:, 3:] == -1).all()
    assert (np.abs(image[:, 1:3]) < 1).all()
    feature = ex['feature']
    assert feature.shape == (4, 8, 3) and np.abs(feature).max() <= 1
    # One vector per class, constant over its pixels.
    assert all(len(np.unique(feature[expected == c], axis=0)) == 1 for c in (0, 1, 7))
    assert len(np.unique(feature.reshape(-1, 3), axis=0)) == 3
  assert seen == {False, True}


def _panoptic_record(segments, objects, image=None):
  """A COCO panoptic record: `segments` the id of each pixel (written into the PNG's RGB as
  id = R + 256 G + 256^2 B) and `objects` (id, label, is_crowd) per segment."""
  segments = np.asarray(segments, np.int64)
  png = np.stack([segments % 256, segments // 256 % 256, segments // 65536], -1).astype(np.uint8)
  ids, labels, crowd = zip(*objects)
  return {
    'image': np.zeros((*segments.shape, 3), np.uint8) if image is None else image,
    'panoptic_image': png,
    'panoptic_objects': {
      'id': np.array(ids, np.int64),
      'label': np.array(labels, np.int64),
      'is_crowd': np.array(crowd, bool),
      'bbox': np.zeros((len(ids), 4), np.float32),
    },
  }


def test_mask_rcnn_instances_are_the_panoptic_thing_segments_after_resize_and_flip():
  # 16 x 24 pixels: maskrcnn-benchmark's 800 x 1200, which the 64 x 96 canvas scales to 4x.
  cfg = dict(image_size=(64, 96), max_instances=3, gt_mask_size=8, num_classes=81)
  segments = np.zeros((16, 24), np.int64)  # 0: unlabelled
  segments[2:10, 2:14] = 300_000  # rectangle A, its top-left quarter covered by B
  segments[2:6, 2:8] = 70_000  # rectangle B
  segments[12:16, 20:24] = 5  # a crowd of people: no instance
  segments[12:16, 0:4] = 6  # stuff (label 80 on): no instance
  image = np.zeros((16, 24, 3), np.uint8)
  image[..., :] = (10, 20, 30)  # RGB
  objects = [(5, 0, True), (300_000, 79, False), (6, 100, False), (70_000, 0, False)]
  record = _panoptic_record(segments, objects, image)
  quarter = np.ones((8, 8), np.uint8)
  quarter[:4, :4] = 0  # A's mask over its box: all but B's quarter
  example = recipes.RECIPES['mask_rcnn'].example
  seen = set()
  for seed in range(8):
    ex = example(record, cfg, np.random.default_rng(seed))
    flipped = bool(ex['gt_boxes'][1, 0] > 48)  # B's left edge: 8 or 64
    seen.add(flipped)
    assert ex['images'].shape == (64, 96, 3) and ex['images'].dtype == np.float32
    # BGR minus maskrcnn-benchmark's pixel mean, all over the canvas the image fills.
    np.testing.assert_allclose(
      ex['images'],
      np.broadcast_to(np.float32([30, 20, 10]) - (102.9801, 115.9465, 122.7717), (64, 96, 3)),
      atol=1e-4,
    )
    assert list(ex['gt_valid']) == [True, True, False]
    assert list(ex['gt_classes']) == [80, 1, 0]  # labels 79 and 0: classes 80 and 1
    # Each box in pixels x 4, x2 - x1 + 1 pixels wide; flipped, x becomes 96 - 1 - x.
    a, b = [8, 8, 55, 39], [8, 8, 31, 23]
    if flipped:
      a, b = [96 - 1 - 55, 8, 96 - 1 - 8, 39], [96 - 1 - 31, 8, 96 - 1 - 8, 23]
    np.testing.assert_allclose(ex['gt_boxes'][:2], [a, b])
    assert not ex['gt_boxes'][2].any() and not ex['gt_masks'][2].any()
    np.testing.assert_array_equal(ex['gt_masks'][0], quarter[:, ::-1] if flipped else quarter)
    np.testing.assert_array_equal(ex['gt_masks'][1], np.ones((8, 8), np.uint8))
    assert ex['gt_masks'].dtype == np.uint8 and ex['gt_classes'].dtype == np.int32
  assert seen == {False, True}
  # Instances past max_instances are dropped, the first kept.
  ex = example(record, {**cfg, 'max_instances': 1}, np.random.default_rng(0))
  assert list(ex['gt_valid']) == [True] and list(ex['gt_classes']) == [80]


def test_mask_rcnn_images_take_the_shorter_side_800_and_fit_the_canvas():
  size = image_examples.maskrcnn_size
  assert size(480, 640, (800, 1088)) == (800, 1066)
  assert size(800, 1000, (800, 1088)) == (800, 1000)  # already 800: as it is
  assert size(300, 1000, (1400, 1400)) == (400, 1333)  # the longer side capped at 1333
  assert size(640, 480, (800, 1088)) == (800, 600)  # portrait: scaled down to the canvas
  cfg = dict(image_size=(64, 96), max_instances=2, gt_mask_size=4, num_classes=81)
  record = _panoptic_record(np.zeros((30, 20), np.int64), [(1, 0, False)])
  ex = recipes.RECIPES['mask_rcnn'].example(record, cfg, np.random.default_rng(0))
  # 30 x 20 to 64 x 42: zeros (the mean) past the image on the right.
  assert (ex['images'][:, :42] != 0).all() and not ex['images'][:, 42:].any()
  assert not ex['gt_valid'].any()  # a segment without pixels is no instance


def test_deeplab_labels_are_voc_classes_of_the_panoptic_segments_scaled_padded_and_flipped():
  cfg = dict(crop=33, classes=21)  # wider than any scaled image: the crop is the padded image
  segments = np.full((8, 12), 4, np.int64)  # stuff (a wall): background
  segments[1:5, 1:6] = 1  # a person: VOC 15
  segments[4:8, 7:12] = 2  # a dog (COCO 18): VOC 12
  segments[0, 8:12] = 3  # a truck: no VOC class, background
  segments[7, 0:3] = 0  # unlabelled: 255
  person, dog, truck = (image_examples.COCO_THING_IDS.index(i) for i in (1, 18, 8))
  objects = [(1, person, False), (2, dog, True), (3, truck, False), (4, 120, False)]
  image = np.zeros((8, 12, 3), np.uint8)
  image[...] = (200, 50, 10)
  record = _panoptic_record(segments, objects, image)
  expected = np.zeros((8, 12), np.int32)
  expected[1:5, 1:6], expected[4:8, 7:12], expected[7, 0:3] = 15, 12, 255
  colour = np.float32([200, 50, 10]) * (2 / 255) - 1
  example = recipes.RECIPES['deeplabv3'].example
  scales, flips = set(), set()
  for seed in range(40):
    ex = example(record, cfg, np.random.default_rng(seed))
    images, labels = ex['images'], ex['labels']
    assert images.shape == (33, 33, 3) and images.dtype == np.float32
    assert labels.shape == (33, 33) and labels.dtype == np.int32
    # The image where it is, the mean pixel (0 in [-1, 1]) and 255 around it.
    inside = images[..., 0] != 0
    rows, cols = np.flatnonzero(inside.any(1)), np.flatnonzero(inside.any(0))
    nh, nw = len(rows), len(cols)
    assert nw / 12 == nh / 8  # one scale on both axes
    flipped = cols[0] > 0
    assert rows[0] == 0 and (cols[-1] == 32 if flipped else cols[0] == 0)
    np.testing.assert_allclose(images[inside], np.broadcast_to(colour, (nh * nw, 3)), atol=1e-5)
    assert not images[~inside].any() and (labels[~inside] == 255).all()
    assert set(np.unique(labels[inside])) == {0, 12, 15, 255}
    if nh == 8:  # scale 1: the hand-made map itself
      np.testing.assert_array_equal(
        labels[inside].reshape(8, 12), expected[:, ::-1] if flipped else expected
      )
    scales.add(nh / 8)
    flips.add(bool(flipped))
  assert scales == {0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0} and flips == {False, True}


def test_deeplab_crops_are_random_windows_of_the_scaled_image():
  cfg = dict(crop=9, classes=21)
  segments = np.zeros((20, 30), np.int64)
  segments[:, :15] = 1  # a person on the left half, unlabelled on the right
  record = _panoptic_record(segments, [(1, 0, False)])
  example = recipes.RECIPES['deeplabv3'].example
  crops = [example(record, cfg, np.random.default_rng(s))['labels'] for s in range(12)]
  assert all(set(np.unique(c)) <= {15, 255} for c in crops)
  assert len({c.tobytes() for c in crops}) > 3  # windows at random places
  # Classes past `classes` wrap onto them: VOC 15 is class 5 of 10.
  assert set(
    np.unique(example(record, {**cfg, 'classes': 10}, np.random.default_rng(0))['labels'])
  ) <= {5, 255}
