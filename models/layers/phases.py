"""Stride-2 resampling convolutions as stride-1 ones over pixel phases (a 2x2 block of pixels).

A 2x upsampling convolution gives each output pixel of phase (a, b), row parity a and column
parity b, a few of its kernel's taps on the input. Computed as one stride-1 convolution of the
input to 4*O channels, one O per phase, then interleaved (`depth_to_space`), its gradients are
ordinary convolutions of their input's size, which XLA hands cuDNN as such; the transposed
convolution's weight gradient is not (models/stylegan/layers.py and models/pix2pixhd/nets.py
say what it becomes). Downsampling is the mirror: `space_to_depth`, then a stride-1 convolution.
"""

import jax.numpy as jnp


def phase_kernel(taps_2xPxT, kernel_TxTxIxO):
  """The stride-1 PxP kernel to 4*O channels, in (row phase, column phase, O) order, whose
  phase (a, b) output applies kernel tap (r, s) to input offset (p, q) with weight
  taps[a, p, r] * taps[b, q, s]."""
  m = jnp.asarray(taps_2xPxT, kernel_TxTxIxO.dtype)
  p, i = m.shape[1], kernel_TxTxIxO.shape[2]
  k = jnp.einsum('apr,bqs,rsio->pqiabo', m, m, kernel_TxTxIxO)
  return k.reshape(p, p, i, -1)


def depth_to_space(y_NxHxWx4O):
  """(N, H, W, 4*O) in (row phase, column phase, O) channel order -> (N, 2H, 2W, O)."""
  n, h, w, c = y_NxHxWx4O.shape
  y = y_NxHxWx4O.reshape(n, h, w, 2, 2, c // 4).transpose(0, 1, 3, 2, 4, 5)
  return y.reshape(n, 2 * h, 2 * w, c // 4)


def space_to_depth(x_NxHxWxC):
  """(N, H, W, C) with H and W even -> (N, H/2, W/2, 4*C), (row phase, column phase, C) order."""
  n, h, w, c = x_NxHxWxC.shape
  x = x_NxHxWxC.reshape(n, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(n, h // 2, w // 2, 4 * c)
