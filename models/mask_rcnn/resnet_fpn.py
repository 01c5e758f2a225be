"""ResNet (He et al. 2016) with frozen batch norm and a Feature Pyramid Network (Lin et al. 2017),
as maskrcnn-benchmark's R-101-FPN body (STRIDE_IN_1X1, FrozenBatchNorm2d, LastLevelMaxPool)."""

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.layers import rbg_init

FROZEN_STAGES = ('stem', 'res2')  # FREEZE_CONV_BODY_AT: 2 freezes the stem and res2


conv_init = rbg_init.rbg(
  nn.initializers.variance_scaling(2.0, 'fan_out', 'normal')
)  # kaiming_normal_
fpn_init = rbg_init.rbg(
  nn.initializers.variance_scaling(1.0, 'fan_in', 'uniform')
)  # kaiming_uniform a=1


class FrozenBatchNorm(nn.Module):
  """A fixed per-channel affine y = x * scale + bias, never trained (FrozenBatchNorm2d).

  The reference loads these from ImageNet-trained batch-norm statistics, which normalize
  each channel of the pretrained network. With random weights we set them the same way from
  the activations of the initialization batch (data-dependent init): each channel comes out
  with zero mean and standard deviation `gain`. They live in the 'frozen_bn' collection, not in
  'params': the optimizer never sees them and the parameter count excludes them, as the
  reference's buffers.
  """

  epsilon: float = 1e-5
  gain: float = 1.0

  @nn.compact
  def __call__(self, x):
    def stats():
      x32 = x.astype(jnp.float32)
      mean, var = x32.mean(axis=(0, 1, 2)), x32.var(axis=(0, 1, 2))
      # A small map (a tiny preset's res5 is 2x2) gives noisy variances: floor them.
      var = jnp.maximum(var, 0.1 * var.mean())
      scale = self.gain * jax.lax.rsqrt(var + self.epsilon)
      return scale, -mean * scale

    scale = self.variable('frozen_bn', 'scale', lambda: stats()[0])
    bias = self.variable('frozen_bn', 'bias', lambda: stats()[1])
    return x * scale.value.astype(x.dtype) + bias.value.astype(x.dtype)


class Bottleneck(nn.Module):
  """1x1 (strided, STRIDE_IN_1X1) -> 3x3 -> 1x1 bottleneck with a projection when needed.

  `residual_gain`: the standard deviation of the residual branch (its last frozen batch norm)
  at initialization; the projection shortcut, where there is one, has unit scale.
  """

  width: int
  out: int
  stride: int
  dtype: Any = jnp.float32
  residual_gain: float = 1.0

  @nn.compact
  def __call__(self, x):
    conv = lambda c, k, s, name: nn.Conv(
      c,
      (k, k),
      (s, s),
      padding=k // 2,
      use_bias=False,
      kernel_init=conv_init,
      dtype=self.dtype,
      name=name,
    )
    shortcut = x
    if x.shape[-1] != self.out or self.stride != 1:
      shortcut = FrozenBatchNorm(name='downsample_bn')(
        conv(self.out, 1, self.stride, 'downsample')(x)
      )
    y = nn.relu(FrozenBatchNorm(name='bn1')(conv(self.width, 1, self.stride, 'conv1')(x)))
    y = nn.relu(FrozenBatchNorm(name='bn2')(conv(self.width, 3, 1, 'conv2')(y)))
    y = FrozenBatchNorm(gain=self.residual_gain, name='bn3')(conv(self.out, 1, 1, 'conv3')(y))
    return nn.relu(y + shortcut)


class ResNetFPN(nn.Module):
  """ResNet body (C2-C5) and FPN outputs P2-P6 of `fpn_channels` channels."""

  blocks: Sequence[int] = (3, 4, 23, 3)
  width: int = 64  # res2 bottleneck width; outputs are 4x, doubling per stage
  fpn_channels: int = 256
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images_BxHxWx3):
    x = nn.Conv(
      self.width,
      (7, 7),
      (2, 2),
      padding=3,
      use_bias=False,
      kernel_init=conv_init,
      dtype=self.dtype,
      name='stem',
    )(images_BxHxWx3)
    x = nn.relu(FrozenBatchNorm(name='stem_bn')(x))
    x = nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
    stages = []
    for i, n in enumerate(self.blocks):
      width = self.width * 2**i
      # Identity shortcuts add the branches up: with each one normalized to unit scale (and
      # the ReLU after each sum adding a positive mean), R-101's C4 reached RMS 24 at full
      # size, the FPN levels 22-25 and the mask logits 64, and the first SGD step at lr 0.02
      # diverged. Branches of scale 1/sqrt(n) keep each stage's output near unit scale, as
      # the small last batch-norm weights of trained networks do.
      gain = 1.0 / math.sqrt(n)
      for j in range(n):
        stride = 2 if (i > 0 and j == 0) else 1
        x = Bottleneck(
          width, 4 * width, stride, self.dtype, residual_gain=gain, name=f'res{i + 2}_{j}'
        )(x)
      if i == 0:
        # The stem and res2 are frozen and nothing below them trains: cutting the gradient
        # here skips their backward pass, as requires_grad=False does in the reference.
        x = jax.lax.stop_gradient(x)
      stages.append(x)
    return FPN(self.fpn_channels, self.dtype, name='fpn')(stages)


def upsample2(x):
  """Nearest-neighbour upsampling by 2 (F.interpolate(scale_factor=2, mode='nearest'))."""
  b, h, w, c = x.shape
  return jnp.broadcast_to(x[:, :, None, :, None], (b, h, 2, w, 2, c)).reshape(b, 2 * h, 2 * w, c)


class FPN(nn.Module):
  """Lateral 1x1 and output 3x3 convolutions, top-down nearest upsampling, P6 by max-pool."""

  channels: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, stages):
    conv = lambda k, name: nn.Conv(
      self.channels, (k, k), padding=k // 2, kernel_init=fpn_init, dtype=self.dtype, name=name
    )
    top = conv(1, f'inner{len(stages) + 1}')(stages[-1])
    outputs = [conv(3, f'layer{len(stages) + 1}')(top)]
    for level in range(len(stages) - 1, 0, -1):
      top = conv(1, f'inner{level + 1}')(stages[level - 1]) + upsample2(top)
      outputs.insert(0, conv(3, f'layer{level + 1}')(top))
    # LastLevelMaxPool: max_pool2d(P5, kernel 1, stride 2) is a strided subsample.
    outputs.append(outputs[-1][:, ::2, ::2])
    return outputs
