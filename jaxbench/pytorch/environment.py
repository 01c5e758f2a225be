"""The software and device a PyTorch result ran on: torch, CUDA, cuDNN, the GPU."""

import sys
from typing import Any

import torch

from jaxbench.core import environment as jax_environment


def _cudnn(code: int | None) -> str | None:
  return jax_environment._cudnn_version(code)  # pylint: disable=protected-access


def environment() -> dict[str, Any]:
  """torch's version and the CUDA and cuDNN it was built with (None without CUDA), torchvision's,
  the driver's (nvidia-smi) and the git commit of the checkout."""
  cuda = torch.cuda.is_available()
  return {
    'torch_version': torch.__version__,
    'torch_cuda_version': torch.version.cuda,
    'cuda_version': torch.version.cuda if cuda else None,
    'cudnn_version': _cudnn(torch.backends.cudnn.version()) if cuda else None,
    'driver_version': jax_environment._nvidia_smi_driver() if cuda else None,  # pylint: disable=protected-access
    'torchvision_version': jax_environment._package('torchvision'),  # pylint: disable=protected-access
    'git_commit': jax_environment._git_commit(),  # pylint: disable=protected-access
    'python': sys.version.split()[0],
  }


def device_info(device: torch.device) -> dict[str, Any]:
  """The record's device: as run_record.device_info has it for JAX (pool_bytes: the allocator's
  cap)."""
  if device.type == 'cuda':
    props = torch.cuda.get_device_properties(device)
    return {
      'platform': 'gpu',
      'kind': props.name,
      'count': torch.cuda.device_count(),
      'total_bytes': props.total_memory,
    }
  return {'platform': 'cpu', 'kind': 'cpu', 'count': 1, 'pool_bytes': None}
