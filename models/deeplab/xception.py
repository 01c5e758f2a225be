"""DeepLab's aligned Xception-65 (Chollet 2017; Dai et al. 2017; Chen et al. 2018, DeepLabv3+).

As tensorflow/models research/deeplab/core/xception.py: max-pooling replaced by strided
separable convolutions, batch norm after every depthwise and pointwise convolution, and atrous
convolution past the requested output stride.
"""

from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from models.layers import depthwise as dw
from models.layers import rbg_init

# xception_arg_scope: truncated-normal weights, batch-norm decay 0.9997, epsilon 1e-3.
BACKBONE_INIT = rbg_init.rbg(nn.initializers.truncated_normal(0.09))
BACKBONE_BN_EPS = 1e-3
BN_DECAY = 0.9997


def fixed_padding(kernel: int, rate: int = 1):
  """TF's explicit padding: independent of the input size, so even sizes stay aligned."""
  effective = kernel + (kernel - 1) * (rate - 1)
  total = effective - 1
  return ((total // 2, total - total // 2),) * 2


def out_size(size: int, stride: int) -> int:
  """Spatial size after a fixed-padded convolution of any kernel."""
  return (size - 1) // stride + 1


class ConvBN(nn.Module):
  """Convolution (no bias), batch norm, optional activation.

  A depthwise convolution (`depthwise=True`) is named so, which keeps it out of
  the weight decay as DeepLab's regularize_depthwise=False does; `depthwise_impl` says how it
  is computed (models/layers/depthwise.py).
  """

  features: int
  kernel: int = 1
  stride: int = 1
  rate: int = 1
  depthwise: bool = False
  activation: Callable[[Any], Any] | None = nn.relu
  bn_eps: float = BACKBONE_BN_EPS
  kernel_init: Callable[..., Any] = BACKBONE_INIT
  dtype: Any = jnp.float32
  depthwise_impl: str = 'cudnn'

  @nn.compact
  def __call__(self, x, train):
    padding = fixed_padding(self.kernel, self.rate)
    if self.depthwise:
      assert self.features == x.shape[-1], 'a depthwise convolution keeps the channel count'
      x = dw.DepthwiseConv(
        self.kernel,
        self.stride,
        padding,
        self.rate,
        kernel_init=self.kernel_init,
        dtype=self.dtype,
        impl=self.depthwise_impl,
        name='depthwise',
      )(x)
    else:
      x = nn.Conv(
        self.features,
        (self.kernel, self.kernel),
        strides=self.stride,
        kernel_dilation=self.rate,
        padding=padding,
        use_bias=False,
        kernel_init=self.kernel_init,
        dtype=self.dtype,
        name='conv',
      )(x)
    x = nn.BatchNorm(
      use_running_average=not train,
      momentum=BN_DECAY,
      epsilon=self.bn_eps,
      dtype=self.dtype,
      name='bn',
    )(x)
    return x if self.activation is None else self.activation(x)


class SeparableConv(nn.Module):
  """DeepLab's split separable convolution: depthwise 3x3 + BN (+act), pointwise 1x1 + BN (+act)."""

  features: int
  stride: int = 1
  rate: int = 1
  activation: Callable[[Any], Any] | None = None
  bn_eps: float = BACKBONE_BN_EPS
  depthwise_init: Callable[..., Any] = BACKBONE_INIT
  pointwise_init: Callable[..., Any] = BACKBONE_INIT
  dtype: Any = jnp.float32
  depthwise_impl: str = 'cudnn'

  @nn.compact
  def __call__(self, x, train):
    x = ConvBN(
      x.shape[-1],
      3,
      self.stride,
      self.rate,
      depthwise=True,
      activation=self.activation,
      bn_eps=self.bn_eps,
      kernel_init=self.depthwise_init,
      dtype=self.dtype,
      depthwise_impl=self.depthwise_impl,
      name='depthwise',
    )(x, train)
    return ConvBN(
      self.features,
      1,
      activation=self.activation,
      bn_eps=self.bn_eps,
      kernel_init=self.pointwise_init,
      dtype=self.dtype,
      name='pointwise',
    )(x, train)


class XceptionModule(nn.Module):
  """Three separable convolutions (the last one strided) and a 'conv', 'sum' or 'none' skip.

  Without `activation_in_separable`, a ReLU precedes each separable convolution
  (the original Xception design); with it, ReLU follows depthwise and pointwise.
  Returns the output and the second separable convolution's output (DeepLab's
  decoder end point in entry_flow/block2).
  """

  depths: tuple[int, int, int]
  skip: str
  stride: int = 1
  rate: int = 1
  activation_in_separable: bool = False
  dtype: Any = jnp.float32
  depthwise_impl: str = 'cudnn'

  @nn.compact
  def __call__(self, inputs, train):
    x = inputs
    second = None
    for i, depth in enumerate(self.depths):
      if not self.activation_in_separable:
        x = nn.relu(x)
      x = SeparableConv(
        depth,
        stride=self.stride if i == 2 else 1,
        rate=self.rate,
        activation=nn.relu if self.activation_in_separable else None,
        dtype=self.dtype,
        depthwise_impl=self.depthwise_impl,
        name=f'separable_conv{i + 1}',
      )(x, train)
      if i == 1:
        second = x
    if self.skip == 'conv':
      x = x + ConvBN(
        self.depths[-1], 1, self.stride, activation=None, dtype=self.dtype, name='shortcut'
      )(inputs, train)
    elif self.skip == 'sum':
      x = x + inputs
    return x, second


def xception_units(cfg):
  """(name, depths, skip, stride, activation_in_separable) of every Xception-65 unit."""
  e1, e2, e3 = cfg['entry_depths']
  x1, x2 = cfg['exit_depths']
  mid = (cfg['middle_depth'],) * 3
  units = [
    ('entry_flow_block1', e1, 'conv', 2, False),
    ('entry_flow_block2', e2, 'conv', 2, False),
    ('entry_flow_block3', e3, 'conv', 2, False),
  ]
  units += [(f'middle_flow_unit{i + 1}', mid, 'sum', 1, False) for i in range(cfg['middle_blocks'])]
  units += [('exit_flow_block1', x1, 'conv', 2, False), ('exit_flow_block2', x2, 'none', 1, True)]
  return units


def dense_strides(units, output_stride):
  """stack_blocks_dense: (stride, rate) per unit; past the target stride, atrous instead."""
  target = output_stride // 2  # the stem's first convolution already halves the input
  current, rate, plan = 1, 1, []
  for unit in units:
    stride = unit[3]
    if current == target:
      plan.append((1, rate))
      rate *= stride
    else:
      plan.append((stride, 1))
      current *= stride
  if current != target:
    raise ValueError(f'output stride {output_stride} cannot be reached')
  return plan


class Xception65(nn.Module):
  """Entry flow, middle flow and exit flow at a given output stride.

  Returns the final features (output stride `output_stride`) and the decoder's
  low-level features (output stride 4).
  """

  cfg: Any
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, train):
    cfg = self.cfg
    stem1, stem2 = cfg['stem']
    x = ConvBN(stem1, 3, 2, dtype=self.dtype, name='entry_flow_conv1_1')(x, train)
    x = ConvBN(stem2, 3, 1, dtype=self.dtype, name='entry_flow_conv1_2')(x, train)
    units = xception_units(cfg)
    low_level = None
    for unit, (stride, rate) in zip(units, dense_strides(units, cfg['output_stride'])):
      name, depths, skip, _, act_in_sep = unit
      x, second = XceptionModule(
        depths,
        skip,
        stride,
        rate,
        act_in_sep,
        dtype=self.dtype,
        depthwise_impl=cfg['depthwise'],
        name=name,
      )(x, train)
      if name == 'entry_flow_block2':
        low_level = second
    return x, low_level


def xception_forward_flops(cfg, size: int) -> tuple[float, int, int]:
  """Forward FLOPs of the backbone on a size x size image; also the feature and low-level sizes."""
  flops = 0.0

  def conv(k, cin, cout, hw, groups=1):
    return 2.0 * k * k * cin * cout * hw * hw / groups

  def separable(cin, cout, hw_out):
    return conv(3, cin, cin, hw_out, groups=cin) + conv(1, cin, cout, hw_out)

  stem1, stem2 = cfg['stem']
  s = out_size(size, 2)
  flops += conv(3, 3, stem1, s) + conv(3, stem1, stem2, s)
  cin, low_level_size = stem2, None
  units = xception_units(cfg)
  for (name, depths, skip, _, _), (stride, _) in zip(
    units, dense_strides(units, cfg['output_stride'])
  ):
    s_out = out_size(s, stride)
    flops += separable(cin, depths[0], s) + separable(depths[0], depths[1], s)
    flops += separable(depths[1], depths[2], s_out)
    if skip == 'conv':
      flops += conv(1, cin, depths[2], s_out)
    if name == 'entry_flow_block2':
      low_level_size = s
    cin, s = depths[2], s_out
  return flops, s, low_level_size
