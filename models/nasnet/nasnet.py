"""NASNet-A Large (Zoph et al. 2018, "Learning Transferable Architectures for Scalable Image
Recognition"), as slim's nets/nasnet and tf_cnn_benchmarks' nasnet_large at 331x331."""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models import workload as wl
from models.layers import depthwise as dw
from models.nasnet import cells


def reduction_layers(num_cells, num_reductions):
  """The normal-cell indices a reduction cell precedes (slim: [6, 12] for 18 cells)."""
  return [int(k / (num_reductions + 1) * num_cells) for k in range(1, num_reductions + 1)]


class NASNetA(nn.Module):
  """The ImageNet NASNet-A: conv stem, two reduction stem cells, then stacks of normal cells.

  Without an auxiliary head, as tf_cnn_benchmarks ran it. Drop-path follows
  slim's schedule: a cell's drop probability grows with its depth and, when
  drop_path_steps > 0, linearly with the training step up to drop_path_steps
  (the step lives in the 'progress' collection, beside the batch statistics).
  """

  cfg: Any
  dtype: Any = jnp.float32

  def _progress(self, train):
    step = self.variable('progress', 'step', lambda: jnp.zeros((), jnp.int32))
    total = self.cfg['drop_path_steps']
    ratio = jnp.minimum(1.0, step.value / total) if total > 0 else 1.0
    if train and not self.is_initializing():
      step.value = step.value + 1
    return ratio

  @nn.compact
  def __call__(self, batch, train):
    cfg = self.cfg
    progress = self._progress(train)
    num_cells, reductions = cfg['num_cells'], cfg['num_reductions']
    total_cells = num_cells + reductions + 2  # + the two stem cells

    def cell(spec, filters, stride, index, name):
      # slim's layer ratio: deeper cells drop more, the last one at 1 - drop_path_keep.
      keep = 1.0 - (index + 1) / total_cells * (1.0 - cfg['drop_path_keep'])
      return cells.Cell(spec, int(filters), stride, keep, self.dtype, cfg['depthwise'], name=name)

    x = batch['images'].astype(self.dtype)
    x = cells.conv(
      int(32 * cfg['stem_multiplier']), 3, self.dtype, 'conv0', stride=2, padding='VALID'
    )(x)
    x = cells.batch_norm(train, self.dtype, 'conv0_bn')(x)
    outputs = [None, x]
    scale = 1.0 / cfg['filter_scaling'] ** 2
    for i in range(2):
      x = cell(cells.REDUCTION, cfg['filters'] * scale, 2, i, f'cell_stem_{i}')(
        x, outputs[-2], train, progress
      )
      outputs.append(x)
      scale *= cfg['filter_scaling']

    where = reduction_layers(num_cells, reductions)
    scale, index = 1.0, 2
    for i in range(num_cells):
      # NASNet-A Large (skip_reduction_layer_input=1): the normal cell after a
      # reduction takes as its second input the cell before the reduction's input.
      prev = outputs[-2]
      if i in where:
        scale *= cfg['filter_scaling']
        x = cell(
          cells.REDUCTION, cfg['filters'] * scale, 2, index, f'reduction_cell_{where.index(i)}'
        )(x, outputs[-2], train, progress)
        outputs.append(x)
        index += 1
      x = cell(cells.NORMAL, cfg['filters'] * scale, 1, index, f'cell_{i}')(
        x, prev, train, progress
      )
      outputs.append(x)
      index += 1

    x = jnp.mean(nn.relu(x), axis=(1, 2))
    x = nn.Dropout(cfg['dense_dropout'], deterministic=not train)(x)
    # Fan-in (LeCun) init, as tf_cnn_benchmarks' final affine layer: logits start near zero.
    return nn.Dense(cfg['num_classes'], dtype=self.dtype, name='logits')(x)


def make_batch(cfg, rng, n):
  """Images in [-1, 1] (inception preprocessing's range) and uniform labels."""
  img_rng, lab_rng = jax.random.split(rng)
  size = cfg['image_size']
  images = 0.5 * jax.random.truncated_normal(img_rng, -2.0, 2.0, (n, size, size, 3))
  labels = jax.random.randint(lab_rng, (n,), 0, cfg['num_classes'], jnp.int32)
  return {'images': images, 'labels': labels}


def loss(cfg, logits, batch):
  """Softmax cross-entropy in float32, optionally label-smoothed (slim's recipe uses 0.1)."""
  logits = logits.astype(jnp.float32)
  targets = optax.smooth_labels(
    jax.nn.one_hot(batch['labels'], logits.shape[-1]), cfg['label_smoothing']
  )
  value = optax.softmax_cross_entropy(logits, targets).mean()
  accuracy = (jnp.argmax(logits, -1) == batch['labels']).mean()
  return value, {'accuracy': accuracy}


def _decay_mask(params):
  """L2 on convolution and dense weights and the dense bias; batch-norm scales and offsets
  are exempt, as tf_cnn_benchmarks' filter_l2_loss_vars intends."""

  def decays(path, _):
    return path[-1].key == 'kernel' or path[-2].key == 'logits'

  return jax.tree_util.tree_map_with_path(decays, params)


def optimizer(cfg):
  """Momentum SGD at a constant rate (tf_cnn_benchmarks' default schedule), L2 weight decay.

  d/dw of wd/2 |w|^2 (tf.nn.l2_loss) is wd * w, which add_decayed_weights adds.
  """
  return optax.chain(
    optax.add_decayed_weights(cfg['weight_decay'], mask=_decay_mask),
    optax.sgd(cfg['lr'], momentum=0.9),
  )


@functools.lru_cache(maxsize=8)
def _forward_flops(cfg_items):
  """Forward FLOPs of one image: 2 * K*K*Cin/groups*Cout*Hout*Wout per conv, 2*in*out per dense.

  The layer shapes come from tracing the model abstractly (jax.eval_shape
  allocates nothing); the count is the formula above, not XLA's estimate.
  """
  cfg = dict(cfg_items)
  flops = []

  def count(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    layer = context.module
    if context.method_name == '__call__' and isinstance(layer, nn.Conv):
      cin = args[0].shape[-1] // layer.feature_group_count
      flops.append(2 * cin * out.size * (layer.kernel_size[0] * layer.kernel_size[1]))
    elif context.method_name == '__call__' and isinstance(layer, dw.DepthwiseConv):
      flops.append(layer.flops(out))
    elif context.method_name == '__call__' and isinstance(layer, nn.Dense):
      flops.append(2 * args[0].shape[-1] * out.size)
    return out

  module = NASNetA(cfg)
  with nn.intercept_methods(count):
    jax.eval_shape(
      lambda: module.init(jax.random.key(0), make_batch(cfg, jax.random.key(0), 1), train=False)
    )
  return float(sum(flops))


def flops_per_example(cfg):
  """Training FLOPs per image: 3x the forward convolutions and dense layer."""
  return 3.0 * _forward_flops(tuple(sorted(cfg.items())))


NASNET_LARGE_CONFIG = dict(
  image_size=331,
  num_classes=1001,
  num_cells=18,
  num_reductions=2,
  filters=168,
  stem_multiplier=3.0,
  filter_scaling=2.0,
  drop_path_keep=0.7,
  # slim's total_training_steps: drop-path ramps in over the first 250k steps.
  drop_path_steps=250000,
  dense_dropout=0.5,
  # tf_cnn_benchmarks' plain sparse softmax cross-entropy; slim's recipe used 0.1.
  label_smoothing=0.0,
  weight_decay=1e-4,
  lr=0.005,  # tf_cnn_benchmarks' NasnetLargeModel default (batch 16)
  # How the depthwise convolutions are computed (models/layers/depthwise.py): XLA's cuDNN
  # grouped convolution ('cudnn') or shifted sums in XLA fusions ('shifts'). On an H200 in bf16
  # at full memory cuDNN runs 326.6 images/s, the shifted sums 35.4.
  depthwise='cudnn',
)
# One normal cell per stack at 64x64 (31 -> 16 -> 8 -> 4 -> 2 pixels, so batch norm in the
# last stack sees more than one pixel per example), drop-path at full strength from the first
# step so the learning test exercises it, and the reference's learning rate.
NASNET_TINY = dict(
  image_size=64, num_classes=10, num_cells=3, filters=8, stem_multiplier=0.25, drop_path_steps=0
)


def check(cfg):
  """Reductions at distinct cells, and an even count of filters in every cell (a factorized
  reduction gives each of its two paths half)."""
  cells_, reductions, scaling = cfg['num_cells'], cfg['num_reductions'], cfg['filter_scaling']
  filters = [int(cfg['filters'] * scaling**k) for k in range(-2, reductions + 1)]
  return wl.first(
    (reductions >= cells_, f'num_reductions ({reductions}) must be less than num_cells ({cells_})'),
    (
      any(f < 2 or f % 2 for f in filters),
      f'filters x filter_scaling**k (k from -2 to num_reductions) must be even numbers of at '
      f'least 2, got {filters}',
    ),
    (int(32 * cfg['stem_multiplier']) < 1, 'stem_multiplier must give at least 1 stem filter'),
  )


NASNET_LARGE = wl.Workload(
  name='nasnet_large',
  description='NASNet-A Large (6@4032, tf_cnn_benchmarks nasnet_large), 331x331, 1001 classes',
  unit='images',
  throughput_unit='images/s',
  config=NASNET_LARGE_CONFIG,
  tiny=NASNET_TINY,
  trainer=wl.supervised(lambda cfg, dtype: NASNetA(cfg, dtype), make_batch, loss, optimizer),
  flops_per_example=flops_per_example,
  family='image',
  spec=dict(
    image_size=wl.Key(lo=3),
    num_reductions=wl.NATURAL,
    stem_multiplier=wl.Key(above=0),
    filter_scaling=wl.Key(above=0),
    drop_path_keep=wl.Key(above=0, hi=1),
    drop_path_steps=wl.NATURAL,
    dense_dropout=wl.FRACTION,
    label_smoothing=wl.FRACTION,
    depthwise=wl.Key(choices=dw.IMPLS),
  ),
  check=check,
)
