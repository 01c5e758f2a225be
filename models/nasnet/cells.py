"""The NASNet-A cells (Zoph et al. 2018, "Learning Transferable Architectures for Scalable
Image Recognition"), as slim's nets/nasnet/nasnet_utils.py.

A cell takes the outputs of the two previous cells (h0 = this input, h1 = the
one before), runs five combinations of two operations each, sums each pair
into a new hidden state, and concatenates the states no combination consumed.
"""

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.layers import depthwise as dw

BN_MOMENTUM = 0.9997  # slim's nasnet_large_arg_scope batch_norm_decay
BN_EPS = 1e-3
# slim's variance_scaling_initializer(mode='FAN_OUT'): He init over fan-out.
KERNEL_INIT = nn.initializers.variance_scaling(2.0, 'fan_out', 'truncated_normal')
# Flax stores a depthwise kernel as (k, k, 1, C), TF as (k, k, C, 1): TF's
# fan-out (k*k) is flax's fan-in.
DEPTHWISE_INIT = nn.initializers.variance_scaling(2.0, 'fan_in', 'truncated_normal')


class CellSpec(NamedTuple):
  """One NASNet-A cell: ten (kind, kernel) operations, their inputs, and the used states."""

  ops: tuple[tuple[str, int], ...]
  inputs: tuple[int, ...]  # hidden-state index each operation reads
  used: tuple[int, ...]  # 1 where a combination consumed the state: left out of the concat


NORMAL = CellSpec(
  ops=(
    ('sep', 5),
    ('sep', 3),
    ('sep', 5),
    ('sep', 3),
    ('avg', 3),
    ('none', 1),
    ('avg', 3),
    ('avg', 3),
    ('sep', 3),
    ('none', 1),
  ),
  inputs=(0, 1, 1, 1, 0, 1, 1, 1, 0, 0),
  used=(1, 0, 0, 0, 0, 0, 0),
)
REDUCTION = CellSpec(
  ops=(
    ('sep', 5),
    ('sep', 7),
    ('max', 3),
    ('sep', 7),
    ('avg', 3),
    ('sep', 5),
    ('none', 1),
    ('avg', 3),
    ('sep', 3),
    ('max', 3),
  ),
  inputs=(0, 1, 0, 1, 0, 1, 3, 2, 2, 0),
  used=(1, 1, 1, 0, 0, 0, 0),
)


def batch_norm(train, dtype, name):
  return nn.BatchNorm(
    use_running_average=not train, momentum=BN_MOMENTUM, epsilon=BN_EPS, dtype=dtype, name=name
  )


def conv(features, kernel, dtype, name, stride=1, padding='SAME'):
  """A bias-free convolution: batch norm follows every one."""
  return nn.Conv(
    features,
    (kernel, kernel),
    strides=stride,
    padding=padding,
    use_bias=False,
    kernel_init=KERNEL_INIT,
    dtype=dtype,
    name=name,
  )


class SeparableStack(nn.Module):
  """Twice: ReLU, separable convolution (depthwise, pointwise), batch norm; the first strides."""

  filters: int
  kernel: int
  stride: int
  dtype: Any = jnp.float32
  depthwise_impl: str = 'cudnn'  # models/layers/depthwise.py

  @nn.compact
  def __call__(self, x, train):
    stride = self.stride
    for i in (1, 2):
      x = nn.relu(x)
      x = dw.DepthwiseConv(
        self.kernel,
        stride,
        'SAME',
        kernel_init=DEPTHWISE_INIT,
        dtype=self.dtype,
        impl=self.depthwise_impl,
        name=f'separable_{i}_depthwise',
      )(x)
      x = conv(self.filters, 1, self.dtype, f'separable_{i}_pointwise')(x)
      x = batch_norm(train, self.dtype, f'bn_sep_{i}')(x)
      stride = 1
    return x


class FactorizedReduction(nn.Module):
  """Halve the resolution without dropping pixels: two 1x1 convolutions on offset grids.

  One path samples the even pixels, the other the odd ones (shifted by one,
  zero-padded at the bottom and right); each gives half the filters.
  """

  filters: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxHxWxC, train):
    assert self.filters % 2 == 0, 'factorized reduction needs an even filter count'
    half = self.filters // 2
    path1 = x_BxHxWxC[:, ::2, ::2]
    shifted = jnp.pad(x_BxHxWxC, ((0, 0), (0, 1), (0, 1), (0, 0)))[:, 1:, 1:]
    path2 = shifted[:, ::2, ::2]
    path1 = conv(half, 1, self.dtype, 'path1_conv')(path1)
    path2 = conv(half, 1, self.dtype, 'path2_conv')(path2)
    y = jnp.concatenate([path1, path2], axis=-1)
    return batch_norm(train, self.dtype, 'final_path_bn')(y)


class Cell(nn.Module):
  """One NASNet-A cell (normal: stride 1, reduction: stride 2).

  keep_prob is this cell's drop-path keep probability already scaled by its
  position (slim's layer ratio); `progress` in [0, 1] scales it further over
  training (slim's current_ratio). Drop-path only acts when train is True.
  """

  spec: CellSpec
  filters: int
  stride: int
  keep_prob: float
  dtype: Any = jnp.float32
  depthwise_impl: str = 'cudnn'  # models/layers/depthwise.py

  def _adjust_prev(self, prev, x, train):
    """Bring the previous cell's output to this cell's resolution and width."""
    if prev is None:
      return x
    if prev.shape[2] != x.shape[2]:
      return FactorizedReduction(self.filters, self.dtype, name='prev_reduction')(
        nn.relu(prev), train
      )
    if prev.shape[-1] != self.filters:
      prev = conv(self.filters, 1, self.dtype, 'prev_1x1')(nn.relu(prev))
      return batch_norm(train, self.dtype, 'prev_bn')(prev)
    return prev

  def _drop_path(self, x, noise_B, progress):
    """Zero a whole example's branch with probability 1 - keep, scaling survivors by 1/keep."""
    if noise_B is None:
      return x
    keep = 1.0 - progress * (1.0 - self.keep_prob)
    mask = jnp.floor(keep + noise_B)[:, None, None, None]
    return (x / keep * mask).astype(x.dtype)

  def _operation(self, x, op, stride, name, train, noise_B, progress):
    kind, kernel = op
    f = self.filters
    if kind == 'sep':
      x = SeparableStack(f, kernel, stride, self.dtype, self.depthwise_impl, name=name)(x, train)
    elif kind == 'none':
      if stride > 1 or x.shape[-1] != f:
        x = conv(f, 1, self.dtype, f'{name}_1x1', stride=stride)(nn.relu(x))
        x = batch_norm(train, self.dtype, f'{name}_bn_1')(x)
      return x  # slim never drops the identity branch
    else:
      pool = nn.max_pool if kind == 'max' else nn.avg_pool
      kwargs = {} if kind == 'max' else {'count_include_pad': False}  # TF's SAME average
      x = pool(x, (kernel, kernel), (stride, stride), padding='SAME', **kwargs)
      if x.shape[-1] != f:
        x = conv(f, 1, self.dtype, f'{name}_1x1')(x)
        x = batch_norm(train, self.dtype, f'{name}_bn_1')(x)
    return self._drop_path(x, noise_B, progress)

  @nn.compact
  def __call__(self, x, prev, train, progress=1.0):
    prev = self._adjust_prev(prev, x, train)
    h = conv(self.filters, 1, self.dtype, '1x1')(nn.relu(x))
    states = [batch_norm(train, self.dtype, 'beginning_bn')(h), prev]
    noise = None
    if train and self.keep_prob < 1.0:
      # One draw for all ten branches: independent per branch and example, as
      # slim's per-branch draws, in one random-number kernel instead of ten.
      noise = jax.random.uniform(self.make_rng('dropout'), (len(self.spec.ops), x.shape[0]))
    for i in range(5):
      branches = []
      for j, side in ((2 * i, 'left'), (2 * i + 1, 'right')):
        src = self.spec.inputs[j]
        stride = self.stride if src < 2 else 1  # only the cell inputs are strided
        branches.append(
          self._operation(
            states[src],
            self.spec.ops[j],
            stride,
            f'comb_iter_{i}_{side}',
            train,
            None if noise is None else noise[j],
            progress,
          )
        )
      states.append(branches[0] + branches[1])
    # NASNet-A's wiring leaves every unused state at the output's shape, so
    # slim's reshaping of mismatched unused states never fires.
    out = [h for h, used in zip(states, self.spec.used) if not used]
    assert all(h.shape == out[-1].shape for h in out), [h.shape for h in out]
    return jnp.concatenate(out, axis=-1)
