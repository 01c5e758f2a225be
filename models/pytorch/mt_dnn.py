"""PyTorch peer of MT-DNN: transformers' BERT-large with the eight GLUE heads, SAN by hand."""

import torch
import torch.nn.functional as F
import transformers
from torch import nn

from models import bert as bert_jax
from models.mt_dnn import mt_dnn as mt_dnn_jax
from models.pytorch import bert as bert_peer
from models.pytorch import peer as peer_lib

TASKS = mt_dnn_jax.TASKS


def _head_init(linear: nn.Linear) -> nn.Linear:
  """MT-DNN's _my_init: N(0, 0.02) weights, zero biases (models/mt_dnn/san.head_init)."""
  nn.init.normal_(linear.weight, std=0.02)
  nn.init.zeros_(linear.bias)
  return linear


def sequence_dropout_mask(rate, batch, features, like, training):
  """MT-DNN's variational dropout: one mask per sequence, shared by its positions, applied to a
  vector rather than to the B x L x H memory (as models/mt_dnn/san.sequence_dropout_mask)."""
  ones = torch.ones((batch, features), dtype=like.dtype, device=like.device)
  return F.dropout(ones, rate, training)


def masked_softmax(scores_BxL, valid_BxL):
  """Softmax over the valid positions, in float32."""
  return torch.softmax(scores_BxL.float().masked_fill(~valid_BxL, float('-inf')), dim=-1)


class SanClassifier(nn.Module):
  """SAN answer module (models/mt_dnn/san.SanClassifier): a GRU state reads the second segment
  for `turns` steps, starting from a self-attention summary of the first; training averages the
  turns' probabilities under stochastic prediction dropout. Returns log-probabilities."""

  def __init__(self, hidden, classes, dropout, turns, mem_drop):
    super().__init__()
    self.dropout, self.turns, self.mem_drop = dropout, turns, mem_drop
    self.query = _head_init(nn.Linear(hidden, 1))
    self.bilinear = _head_init(nn.Linear(hidden, hidden))
    self.classifier = _head_init(nn.Linear(4 * hidden, classes))
    self.gru = nn.GRUCell(hidden, hidden)  # torch's default init, as the JAX GRUCell's

  def forward(self, hidden_BxLxH, first_BxL, second_BxL):
    batch, _, h = hidden_BxLxH.shape
    drop = lambda x: F.dropout(x, self.dropout, self.training)
    seq_mask = lambda: sequence_dropout_mask(self.dropout, batch, h, hidden_BxLxH, self.training)
    m_BxH = seq_mask()
    w_BxH = m_BxH * self.query.weight[0].to(m_BxH.dtype)
    scores_BxL = torch.einsum('blh,bh->bl', hidden_BxLxH, w_BxH) + self.query.bias
    alpha_BxL = masked_softmax(scores_BxL, first_BxL)
    s_BxH = m_BxH * torch.einsum('bl,blh->bh', alpha_BxL.to(hidden_BxLxH.dtype), hidden_BxLxH)
    logits = []
    for _ in range(self.turns):  # the turns share their weights
      wy_BxH = self.bilinear(drop(s_BxH)) * seq_mask()
      scores_BxL = torch.einsum('blh,bh->bl', hidden_BxLxH, wy_BxH.to(hidden_BxLxH.dtype))
      att_BxL = masked_softmax(scores_BxL, second_BxL)
      x_sum_BxH = torch.einsum('bl,blh->bh', att_BxL.to(hidden_BxLxH.dtype), hidden_BxLxH)
      s_BxH = s_BxH.to(x_sum_BxH.dtype)
      features = torch.cat([x_sum_BxH, s_BxH, (x_sum_BxH - s_BxH).abs(), x_sum_BxH * s_BxH], -1)
      logits.append(self.classifier(drop(features)).float())
      s_BxH = self.gru(x_sum_BxH, drop(s_BxH))
    probs_BxTxC = torch.softmax(torch.stack(logits, dim=1), dim=-1)
    if self.training and self.mem_drop > 0:
      # Stochastic prediction dropout: drop whole turns, but always keep one random turn.
      keep_BxT = torch.rand((batch, self.turns), device=probs_BxTxC.device) < 1 - self.mem_drop
      forced = torch.randint(0, self.turns, (batch,), device=probs_BxTxC.device)
      keep_BxT = keep_BxT | F.one_hot(forced, self.turns).bool()
      probs_BxTxC = probs_BxTxC * (keep_BxT / (1 - self.mem_drop))[..., None]
    return torch.log(probs_BxTxC.mean(dim=1))


class PooledHead(nn.Module):
  """Dropout then a dense layer on BERT's pooled [CLS] vector (models/mt_dnn.PooledHead)."""

  def __init__(self, hidden, classes, dropout):
    super().__init__()
    self.dropout = dropout
    self.dense = _head_init(nn.Linear(hidden, classes))

  def forward(self, pooled_BxH):
    return self.dense(F.dropout(pooled_BxH, self.dropout, self.training)).float()


class MtDnnAdamax(torch.optim.Optimizer):
  """MT-DNN's Adamax (models/mt_dnn/adamax.py) with decoupled weight decay and a schedule:
  m = b1 m + (1 - b1) g, u = max(b2 u, |g| + eps), p -= lr(count) (m / (u + eps) + wd p).

  No bias correction, unlike torch.optim.Adamax. A parameter without a gradient (another
  task's head) steps with a zero gradient, as the JAX workload's dense gradients have it, so
  every update moves every parameter. A step the gradient scaler skips does not count.
  """

  def __init__(self, params, schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01):
    super().__init__(params, dict(b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
    self.schedule = schedule
    self.updates = 0

  @torch.no_grad()
  def step(self, closure=None):
    assert closure is None, 'MtDnnAdamax takes no closure'
    lr = self.schedule(self.updates)
    self.updates += 1
    for group in self.param_groups:
      for p in group['params']:
        if not self.state[p]:
          self.state[p]['exp_avg'] = torch.zeros_like(p)
          self.state[p]['exp_inf'] = torch.zeros_like(p)
      with_grad = [p for p in group['params'] if p.grad is not None]
      without = [p for p in group['params'] if p.grad is None]
      for params, grads in ((with_grad, [p.grad for p in with_grad]), (without, None)):
        if params:
          self._update(params, grads, lr, group)

  def _update(self, params, grads, lr, group):
    b1, b2, eps, wd = group['b1'], group['b2'], group['eps'], group['weight_decay']
    mus = [self.state[p]['exp_avg'] for p in params]
    nus = [self.state[p]['exp_inf'] for p in params]
    torch._foreach_mul_(mus, b1)
    torch._foreach_mul_(nus, b2)
    if grads is None:  # g = 0: m = b1 m, u = max(b2 u, eps)
      torch._foreach_clamp_min_(nus, eps)
    else:
      torch._foreach_add_(mus, grads, alpha=1 - b1)
      magnitudes = torch._foreach_abs(grads)
      torch._foreach_add_(magnitudes, eps)
      torch._foreach_maximum_(nus, magnitudes)
    steps = torch._foreach_div(mus, torch._foreach_add(nus, eps))
    if wd:
      torch._foreach_add_(steps, params, alpha=wd)
    torch._foreach_add_(params, steps, alpha=-lr)


def build(cfg, device) -> peer_lib.Setup:
  """The encoder and pooler shared by the tasks, one head per task, one Adamax over all, and
  one Update per task in TASKS' order, each with MT-DNN's global-norm clip."""
  h = cfg['hidden']
  with torch.device(device):
    encoder = transformers.BertModel(bert_peer.bert_config(cfg))  # with BERT's pooler
    heads = nn.ModuleDict(
      {
        t.name: SanClassifier(h, t.classes, t.dropout, cfg['turns'], cfg['mem_drop'])
        if t.head == 'san'
        else PooledHead(h, t.classes, t.dropout)
        for t in TASKS
      }
    )
  encoder.train()
  heads.train()
  total = cfg['total_steps']
  warmup = max(int(cfg['warmup'] * total), 1)
  optimizer = MtDnnAdamax(
    [*encoder.parameters(), *heads.parameters()],
    bert_peer.warmup_linear(cfg['lr'], warmup, total),
  )

  def task_loss(task):
    head = heads[task.name]

    def loss(batch, step):
      del step
      b = batch[task.name]
      tokens, segments = b['tokens'], b['segments']
      out = encoder(input_ids=tokens, token_type_ids=segments)
      if task.head == 'san':
        valid = tokens != bert_jax.PAD
        outputs = head(out.last_hidden_state, valid & (segments == 0), valid & (segments == 1))
      else:
        outputs = head(out.pooler_output)
      if task.head == 'regression':
        return torch.mean((outputs[:, 0] - b['labels'].float()) ** 2)
      return bert_peer.cross_entropy(outputs, b['labels'])

    return loss

  updates = [peer_lib.Update(task_loss(t), optimizer, clip_norm=cfg['clip']) for t in TASKS]
  return peer_lib.Setup(modules={'encoder': encoder, 'heads': heads}, updates=updates)


def make_batch(cfg, n, generator, device):
  """models/mt_dnn.make_batch: {task name: batch} of full-length sequences; pair tasks split at
  a random point, labels are class ids or an STS-B score in [0, 5]."""
  length = cfg['seq_len']
  batches = {}
  for task in TASKS:
    tokens = torch.randint(
      1, cfg['vocab'], (n, length), generator=generator, device=device, dtype=torch.int32
    )
    if task.pair:
      split = torch.randint(
        length // 4, 3 * length // 4 + 1, (n, 1), generator=generator, device=device
      )
      segments = (torch.arange(length, device=device)[None] >= split).to(torch.int32)
    else:
      segments = torch.zeros((n, length), dtype=torch.int32, device=device)
    if task.head == 'regression':
      labels = 5.0 * torch.rand((n,), generator=generator, device=device)
    else:
      labels = torch.randint(
        0, task.classes, (n,), generator=generator, device=device, dtype=torch.int32
      )
    batches[task.name] = {'tokens': tokens, 'segments': segments, 'labels': labels}
  return batches


MT_DNN = peer_lib.Peer(
  name='mt_dnn',
  build=build,
  make_batch=make_batch,
  source=(
    'transformers BertModel (sdpa) with its pooler; SAN answer modules, pooled heads and '
    "MT-DNN's Adamax by hand"
  ),
  compiled=('encoder',),  # --torch_compile: the encoder the eight tasks share, once
)
