"""VGG19 (Simonyan & Zisserman 2014) as a fixed feature extractor for perceptual losses.

pix2pixHD's VGGLoss reads torchvision's vgg19().features after relu1_1, relu2_1,
relu3_1, relu4_1 and relu5_1. jaxbench never trains this network and needs no
pretrained weights for timing: its parameters are random (He-normal kernels, zero
biases), drawn once at init, and held outside the trained parameters.
"""

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

# The 3x3 convolutions of each stage up to conv5_1, the deepest layer the loss reads
# (VGG19 has four in stage 5; the other three would be dead code).
STAGE_CONVS = (2, 2, 4, 4, 1)
STAGE_WIDTHS = (1, 2, 4, 8, 8)  # multiples of the first stage's 64 channels
# pix2pixHD's weights of the five feature maps, shallow to deep.
LAYER_WEIGHTS = (1.0 / 32, 1.0 / 16, 1.0 / 8, 1.0 / 4, 1.0)


class VGG19Features(nn.Module):
  """Returns [relu1_1, relu2_1, relu3_1, relu4_1, relu5_1] of an NHWC image.

  A stage starts with a 2x2 max-pool (except the first) and its first ReLU is the
  feature pix2pixHD reads, as torchvision's slices end.
  """

  base: int = 64
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxHxWx3) -> Sequence[jax.Array]:
    # He-normal keeps random ReLU features at a steady scale through 13 layers.
    he = nn.initializers.variance_scaling(2.0, 'fan_in', 'normal')
    conv = lambda ch, name: nn.Conv(
      ch, (3, 3), padding=1, dtype=self.dtype, kernel_init=he, name=name
    )
    x = x_BxHxWx3.astype(self.dtype)
    features = []
    for stage, (convs, mult) in enumerate(zip(STAGE_CONVS, STAGE_WIDTHS), start=1):
      if stage > 1:
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
      for i in range(1, convs + 1):
        x = nn.relu(conv(self.base * mult, f'conv{stage}_{i}')(x))
        if i == 1:
          features.append(x)
    return features


def kernel_std(shape: Sequence[int]) -> float:
  """He-normal's standard deviation for a kernel of this shape, as the module declares."""
  return math.sqrt(2.0 / math.prod(shape[:-1]))


def perceptual_loss(module: VGG19Features, params, x_BxHxWx3, y_BxHxWx3) -> jax.Array:
  """pix2pixHD's VGGLoss: weighted L1 between the features, the target's held constant."""
  apply = lambda img: module.apply({'params': jax.lax.stop_gradient(params)}, img)
  fx, fy = apply(x_BxHxWx3), apply(y_BxHxWx3)
  total = jnp.float32(0.0)
  for w, a, b in zip(LAYER_WEIGHTS, fx, fy):
    diff = a.astype(jnp.float32) - jax.lax.stop_gradient(b).astype(jnp.float32)
    total += w * jnp.mean(jnp.abs(diff))
  return total


def flops(height: int, width: int, base: int = 64) -> float:
  """Forward FLOPs of the convolutions up to conv5_1 on one HxW image."""
  total, cin, h, w = 0.0, 3, height, width
  for stage, (convs, mult) in enumerate(zip(STAGE_CONVS, STAGE_WIDTHS)):
    if stage:
      h, w = h // 2, w // 2
    for _ in range(convs):
      total += 2 * 9 * cin * base * mult * h * w
      cin = base * mult
  return total
