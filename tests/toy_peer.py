"""A toy PyTorch peer of bert_base for the harness's tests: the batch of bert_base's make_batch
(shapes, dtypes, ranges), an embedding and a linear layer trained on the masked tokens with
AdamW. Not the BERT peer: it exercises the harness, not the model.

TOY_OOM_ABOVE (environment): a batch of more examples raises torch.OutOfMemoryError in its loss,
as a GPU allocator over its cap would, so that the search's recovery runs on the CPU.
`install()` puts it in the peer registry in place of any bert_base peer; a `sitecustomize.py`
that calls it (tests/test_frameworks.py writes one) does so in the processes a test starts.
"""

import os

import torch

from models.pytorch import peer as peer_lib
from models.pytorch import registry

OOM_ENV = 'TOY_OOM_ABOVE'


def build(cfg, device):
  embed = torch.nn.Embedding(cfg['vocab'], cfg['hidden'], device=device)
  head = torch.nn.Linear(cfg['hidden'], cfg['vocab'], device=device)
  params = [*embed.parameters(), *head.parameters()]
  optimizer = torch.optim.AdamW(params, lr=cfg['lr'], weight_decay=0.01)
  limit = os.environ.get(OOM_ENV)

  def loss(batch, step):
    del step
    n = batch['tokens'].shape[0]
    if limit is not None and n > int(limit):
      raise torch.OutOfMemoryError(f'CUDA out of memory (toy limit of {limit} examples)')
    hidden = embed(batch['tokens'])  # [n, L, H]
    index = batch['masked_positions'][..., None].expand(-1, -1, hidden.shape[-1])
    logits = head(torch.gather(hidden, 1, index))  # [n, M, V]
    return torch.nn.functional.cross_entropy(
      logits.float().flatten(0, 1), batch['masked_ids'].flatten()
    )

  return peer_lib.Setup({'embed': embed, 'head': head}, [peer_lib.Update(loss, optimizer, 1.0)])


def make_batch(cfg, n, generator, device):
  length, masked, vocab = cfg['seq_len'], cfg['masked'], cfg['vocab']
  scores = torch.rand((n, length - 1), generator=generator, device=device)
  return {
    'tokens': torch.randint(1, vocab, (n, length), generator=generator, device=device),
    'segments': (torch.arange(length, device=device) >= length // 2).int()[None].repeat(n, 1),
    'masked_positions': 1 + scores.topk(masked).indices,
    'masked_ids': torch.randint(1, vocab, (n, masked), generator=generator, device=device),
    'masked_weights': torch.ones((n, masked), device=device),
    'next_sentence': torch.randint(0, 2, (n,), generator=generator, device=device),
  }


TOY = peer_lib.Peer('bert_base', build, make_batch, source='toy: an embedding and a linear layer')


def install(peers=None) -> None:
  """Put the toy in `peers` (the registry's dict) as bert_base's peer."""
  (registry._PEERS if peers is None else peers)['bert_base'] = TOY  # pylint: disable=protected-access
