"""Convolutions whose second derivatives run at first-derivative speed, for R1 (models/pytorch/
stylegan.py): a penalty on the discriminator's input gradient, differentiated again in its update.

Autograd's double backward of a convolution computes the weight term as a forward convolution
whose window is the image, and a grouped (depthwise) convolution's backward runs PyTorch's native
depthwise kernels; both are slow in cuDNN at 1024x1024. Here each derivative is itself a Function
with a hand-written derivative, the idea of NVlabs' stylegan2-ada-pytorch conv2d_gradfix.
"""

import torch
from torch.nn import functional as F


def _autocast(*tensors):
  """The tensors in autocast's dtype where it is on (a custom Function's forward sees it on but
  does not cast), so that its backward computes in the forward's dtype."""
  device = tensors[0].device.type
  if not torch.is_autocast_enabled(device):
    return tensors
  dtype = torch.get_autocast_dtype(device)
  return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)


class _Blur(torch.autograd.Function):
  """The blur as a depthwise conv2d whose gradient is the blur again (the kernel is symmetric and
  zero-padded to the same size, so the filter is its own adjoint), to every order. Autograd's own
  derivative of a grouped convolution runs the slow depthwise backward kernels, and R1 takes a
  second derivative through every blur of the discriminator."""

  @staticmethod
  def forward(ctx, x_NxCxHxW, kernel_Cx1x3x3):
    (x_NxCxHxW,) = _autocast(x_NxCxHxW)
    ctx.save_for_backward(kernel_Cx1x3x3)
    kernel = kernel_Cx1x3x3.to(x_NxCxHxW.dtype)
    return F.conv2d(x_NxCxHxW, kernel, padding=1, groups=x_NxCxHxW.shape[1])

  @staticmethod
  def backward(ctx, grad_NxCxHxW):
    (kernel,) = ctx.saved_tensors
    return _Blur.apply(grad_NxCxHxW, kernel), None


def blur(x_NxCxHxW, kernel_Cx1x3x3):
  """A symmetric 3x3 depthwise filter, zero-padded to the same size, with fast derivatives
  (_Blur)."""
  return _Blur.apply(x_NxCxHxW, kernel_Cx1x3x3)


class _Conv2d(torch.autograd.Function):
  """F.conv2d whose input gradient is itself a Function (_Conv2dInputGrad) with a hand-written
  derivative. R1 differentiates the discriminator's input gradient with respect to its weights;
  autograd's double backward of a convolution computes that as a forward convolution whose window
  is the image, which cuDNN runs with a slow generic kernel (13.4 s of a stylegan iteration at 16
  images on an H200), where a weight-gradient convolution does the same work fast. NVlabs'
  stylegan2-ada-pytorch replaces conv2d for the same reason (its conv2d_gradfix)."""

  @staticmethod
  def forward(ctx, x, weight, stride, padding):
    x, weight = _autocast(x, weight)
    ctx.save_for_backward(x, weight)
    ctx.stride, ctx.padding = stride, padding
    return F.conv2d(x, weight, stride=stride, padding=padding)

  @staticmethod
  def backward(ctx, grad_y):
    x, weight = ctx.saved_tensors
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:
      grad_x = _Conv2dInputGrad.apply(grad_y, weight, x.shape, ctx.stride, ctx.padding)
    if ctx.needs_input_grad[1]:
      grad_w = torch.nn.grad.conv2d_weight(
        x, weight.shape, grad_y.to(x.dtype), ctx.stride, ctx.padding
      )
    return grad_x, grad_w, None, None


class _Conv2dInputGrad(torch.autograd.Function):
  """A convolution's input gradient (a transposed convolution), linear in the output gradient
  and in the weight: its own derivatives are a convolution and a weight gradient."""

  @staticmethod
  def forward(ctx, grad_y, weight, x_shape, stride, padding):
    grad_y, weight = _autocast(grad_y, weight)
    grad_y = grad_y.to(weight.dtype)
    ctx.save_for_backward(grad_y, weight)
    ctx.stride, ctx.padding = stride, padding
    return torch.nn.grad.conv2d_input(x_shape, weight, grad_y, stride, padding)

  @staticmethod
  def backward(ctx, grad_grad_x):
    grad_y, weight = ctx.saved_tensors
    grad_grad_x = grad_grad_x.to(weight.dtype)
    grad_grad_y = grad_weight = None
    if ctx.needs_input_grad[0]:
      grad_grad_y = _Conv2d.apply(grad_grad_x, weight, ctx.stride, ctx.padding)
    if ctx.needs_input_grad[1]:
      grad_weight = torch.nn.grad.conv2d_weight(
        grad_grad_x, weight.shape, grad_y, ctx.stride, ctx.padding
      )
    return grad_grad_y, grad_weight, None, None, None


def conv2d(x_NxCxHxW, weight_OxIxKxK, stride=1, padding=0):
  """F.conv2d (no groups, no dilation) with fast second derivatives (_Conv2d)."""
  return _Conv2d.apply(x_NxCxHxW, weight_OxIxKxK, stride, padding)
