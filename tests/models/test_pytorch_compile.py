"""--torch_compile on every PyTorch peer: what Dynamo captures (traced with its eager backend, so
without Inductor's code generation), and that the steady state recompiles nothing."""

import pytest
import torch
from torch._dynamo.utils import counters

from jaxbench.pytorch import program
from models import registry
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry

CPU = torch.device('cpu')
# The graphs Dynamo captures per peer at the tiny preset. One where the whole step or the
# compiled module is one graph; mt_dnn compiles its shared encoder (its eight task losses compiled
# each gave eight graphs of it), mask_rcnn its backbone (its heads broke the graph 32 times on
# data-dependent shapes); stylegan's R1 penalty and unsupmt's generation run eager, between
# graphs, and unsupmt's four updates specialize on their languages.
GRAPHS = {'stylegan': 3, 'unsupmt': 6}

pytestmark = pytest.mark.usefixtures('torch_one_thread')


@pytest.mark.parametrize('name', peer_registry.names())
def test_each_peer_compiles_to_its_graphs_and_then_recompiles_nothing(name):
  cfg = registry.get(name).resolve(tiny=True)
  peer = peer_registry.get(name)
  setup = peer.build(cfg, CPU)
  batch = peer.make_batch(cfg, 2, torch.Generator(CPU).manual_seed(0), CPU)
  torch._dynamo.reset()  # pylint: disable=protected-access
  counters.clear()
  try:
    program.compile_scope(setup, peer.compiled, backend='eager')
    for step in range(2):
      peer_lib.run_updates(setup, batch, step)
    graphs = counters['stats']['unique_graphs']
    for step in range(2, 4):
      loss = peer_lib.run_updates(setup, batch, step)
    assert torch.isfinite(loss)
    assert graphs == GRAPHS.get(name, 1)
    assert counters['stats']['unique_graphs'] == graphs  # the steady state recompiles nothing
  finally:
    torch._dynamo.reset()  # pylint: disable=protected-access
