"""Every config key of every workload: a value of the wrong type, or out of its range, is one
line that names the key and the value, before anything is built."""

import math

import pytest

from jaxbench import cli
from models import registry
from models import workload as wl


def _keys():
  return [(w.name, key) for w in registry.all_workloads() for key in sorted(w.config)]


def _scalar(default):
  return _scalar(default[0]) if isinstance(default, tuple) else default


def _bad_scalar(w, key):
  """A value of the key's own type that its range refuses."""
  spec, default = w.spec.get(key, wl.Key()), _scalar(w.config[key])
  if spec.choices:
    return 'not_a_choice' if isinstance(default, str) else max(spec.choices) + 1
  if spec.above is not None:
    return spec.above
  if spec.lo is not None:
    return spec.lo - 1
  if spec.hi is not None:
    return spec.hi + 1
  return {int: 0, float: -1.0}[type(default)]


def _text(default, scalar):
  """--set's text of the default with its first number replaced by `scalar`."""
  if isinstance(default, tuple):
    inner = [_text(d, scalar if i == 0 else _scalar(d)) for i, d in enumerate(default)]
    return '[' + ','.join(inner) + ']'
  return str(scalar)


def _wrong_type(default):
  if isinstance(default, tuple):
    return '[1,x]'
  return {bool: 'maybe', int: '1.5', float: 'abc', str: None}[type(default)]


def _one_line_naming(e, name, key, value):
  text = str(e)
  assert '\n' not in text, text
  assert text.startswith(f'{name}: {key} '), text
  assert value in text, text


@pytest.mark.parametrize('name, key', _keys())
def test_a_wrong_type_names_the_key(name, key):
  w = registry.get(name)
  value = _wrong_type(w.config[key])
  if value is None:  # a string key: its range is its choices
    assert w.spec[key].choices, f'{name}: the string key {key} declares no choices'
    return
  with pytest.raises(ValueError) as e:
    w.resolve(tiny=True, overrides={key: value})
  _one_line_naming(e.value, name, key, value)


@pytest.mark.parametrize('name, key', _keys())
def test_a_value_out_of_range_names_the_key(name, key):
  w = registry.get(name)
  value = _text(w.config[key], _bad_scalar(w, key))
  for tiny in (False, True):
    with pytest.raises(ValueError) as e:
      w.resolve(tiny=tiny, overrides={key: value})
    _one_line_naming(e.value, name, key, value)


@pytest.mark.parametrize('name', registry.names())
def test_the_presets_pass_their_own_checks(name):
  w = registry.get(name)
  for tiny in (False, True):
    cfg = w.resolve(tiny=tiny)
    assert w.check(cfg) is None
    # Each value given back as text parses to itself.
    texts = {k: wl._text(v) for k, v in cfg.items()}
    assert w.resolve(tiny=tiny, overrides=texts) == cfg


def _plan(*sets, model='bert_base'):
  return cli.plan(cli.Args(model=(model,), tiny=True, set=sets))


@pytest.mark.parametrize(
  'model, sets, says',
  [
    ('bert_base', ['heads=0'], 'bert_base: heads must be an integer at least 1, got 0'),
    ('bert_base', ['heads=3'], 'heads (3) must divide hidden (32)'),
    ('bert_base', ['hidden=-8'], 'hidden must be an integer at least 1, got -8'),
    ('bert_base', ['masked=128'], 'masked (128) must be less than seq_len (16)'),
    ('bert_base', ['layers=0'], 'layers must be an integer at least 1, got 0'),
    ('bert_base', ['layers=abc'], 'layers must be an integer at least 1, got abc'),
    ('bert_base', ['seq_len=64'], 'seq_len (64) must be at most max_positions (32)'),
    ('bert_base', ['dropout=1'], 'dropout must be a finite number at least 0 and below 1'),
    ('bert_base', ['lr=nan'], 'lr must be a finite number at least 0, got nan'),
    ('bert_squad', ['question_len=23'], 'question_len (23) must be at most seq_len - 2'),
    ('mt_dnn', ['heads=5'], 'heads (5) must divide hidden (32)'),
    ('mt_dnn', ['warmup=2'], 'warmup must be a finite number at least 0 and at most 1'),
    ('transformer_big', ['heads=3'], 'heads (3) must divide d_model (32)'),
    ('unsupmt', ['seq_len=30'], 'max_positions (32) must cover a generation'),
    ('conv_seq2seq', ['src_len=16'], 'must be less than max_positions (16)'),
    ('conv_seq2seq', ['conv_impl=cudnn'], 'conv_impl must be one of gemm, xla, got cudnn'),
    ('mask_rcnn', ['blocks=3,4,6'], 'blocks must be a list of integers of length 4, got 3,4,6'),
    ('mask_rcnn', ['image_size=[64,60]'], 'image_size (64, 60) must be multiples of 32'),
    ('mask_rcnn', ['roi_batch=64'], 'roi_batch must be at most post_nms_top_n + max_instances'),
    ('yolov3', ['image=100'], 'image (100) must be a multiple of 32'),
    ('nasnet_large', ['filters=7'], 'must be even numbers of at least 2'),
    ('nasnet_large', ['num_reductions=3'], 'num_reductions (3) must be less than num_cells (3)'),
    ('deeplabv3', ['output_stride=12'], 'output_stride must be one of 8, 16, 32, got 12'),
    ('stylegan', ['resolution=12'], 'resolution (12) must be a power of 2'),
    ('stylegan', ['mbstd_features=3'], 'mbstd_features (3) must divide the 4x4 channels'),
    ('pix2pixhd', ['height=34'], 'must be multiples of 2**(n_downsample_global + 1) = 4'),
  ],
)
def test_bad_values_and_broken_constraints_are_one_usage_line(model, sets, says):
  with pytest.raises(cli.UsageError) as e:
    _plan(*sets, model=model)
  assert says in str(e.value) and '\n' not in str(e.value), str(e.value)


@pytest.mark.parametrize(
  'default, text, value',
  [
    (True, 'false', False),
    (True, 'False', False),
    (False, '1', True),
    (True, '0', False),
    (False, 'TRUE', True),
    ((3, 4, 23, 3), '[3,4,6,3]', (3, 4, 6, 3)),
    ((3, 4, 23, 3), '3,4,6,3', (3, 4, 6, 3)),
    ((3, 4, 23, 3), '(3, 4, 6, 3)', (3, 4, 6, 3)),
    (((512, 3),), '[16,3],[32,1]', ((16, 3), (32, 1))),
    ((16.0, 640.0), '10,40', (10.0, 40.0)),
    (0.1, '1e-3', 1e-3),
    (7, ' 8 ', 8),
  ],
)
def test_values_parse_as_the_defaults_type(default, text, value):
  key = wl.Key(sized=not isinstance(default, tuple) or not isinstance(default[0], tuple))
  parsed = wl.parse(default, key, text)
  assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize(
  'default, key, text',
  [
    (True, wl.Key(), 'yes'),
    (3, wl.Key(), '3.5'),
    (3, wl.Key(), 'inf'),
    (3, wl.Key(), float('inf')),
    (3, wl.Key(), True),
    (0.5, wl.Key(), float('nan')),
    (0.5, wl.Key(), 'inf'),
    (0.5, wl.Key(), '-inf'),
    (0.5, wl.Key(above=0), '0'),
    (0.5, wl.Key(hi=1), '1.01'),
    ((3, 4), wl.Key(), '[3]'),
    ((3, 4), wl.Key(), '[]'),
    ((3, 4), wl.Key(), '[3, true]'),
    ((3, 4), wl.Key(), '[[3], [4]]'),
    ('gemm', wl.Key(choices=('gemm', 'xla')), 'cudnn'),
  ],
)
def test_values_outside_the_type_or_range_are_refused(default, key, text):
  with pytest.raises(ValueError):
    wl.parse(default, key, text)


def test_a_float_key_never_takes_nan():
  for w in registry.all_workloads():
    for key, default in w.config.items():
      if isinstance(default, float):
        with pytest.raises(ValueError):
          w.resolve(overrides={key: 'nan'})
        assert math.isfinite(w.resolve()[key])


# Values at the edge of their ranges and constraints, which the model code must still build.
EDGES = [
  ('bert_base', {'heads': '32', 'layers': '1', 'masked': '15'}),
  ('bert_squad', {'question_len': '22'}),
  ('mask_rcnn', {'blocks': '[3,4,6,3]'}),
  ('deeplabv3', {'output_stride': '8'}),
  ('yolov3', {'image': '32'}),
  ('pix2pixhd', {'height': '8', 'width': '8'}),
  ('nasnet_large', {'num_reductions': '0'}),
  ('stylegan', {'mbstd_features': '16'}),
  ('conv_seq2seq', {'src_len': '15', 'tgt_len': '15'}),
  ('unsupmt', {'seq_len': '11'}),
  ('transformer_big', {'d_model': '4', 'heads': '4', 'ffn': '8'}),
]


@pytest.mark.slow
@pytest.mark.parametrize('name, overrides', EDGES)
def test_values_at_the_edges_build_and_step(name, overrides):
  import jax  # pylint: disable=g-import-not-at-top

  from models import precision  # pylint: disable=g-import-not-at-top

  w = registry.get(name)
  cfg = w.resolve(tiny=True, overrides=overrides)
  trainer = w.trainer(cfg, precision.get('fp32'))
  state = jax.eval_shape(trainer.init, jax.random.key(0))
  batch = jax.eval_shape(lambda r: trainer.make_batch(r, w.example_size(cfg)), jax.random.key(1))
  _, metrics = jax.eval_shape(trainer.step, state, batch, jax.random.key(2))
  assert metrics['loss'].shape == ()
