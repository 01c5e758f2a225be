"""Fixtures of the model tests."""

import pytest


@pytest.fixture
def torch_one_thread():
  """The PyTorch peers' tests on one intra-op thread: their layers are tiny, and on a shared
  two-core machine a second thread only contends with the other test workers (measured: the
  small convolutions of nasnet_large's peer ten times slower with two)."""
  import torch  # pylint: disable=g-import-not-at-top

  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)
