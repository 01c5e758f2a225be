"""PyTorch peers of BERT-base pretraining (MLM + NSP) and SQuAD fine-tuning: transformers' BERT.

The encoder is transformers' BertModel (post-LN layers, erf GELU, LayerNorm epsilon 1e-12,
dropout on the embeddings, the attention probabilities and each sub-block's output) under its
"sdpa" attention. The synthetic batches hold no padding, so no attention mask is passed: the
encoder attends everywhere, as the JAX workload's all-valid mask lets it, and SDPA keeps its
flash kernel (transformers drops an all-valid mask itself, but only outside torch.compile).
"""

import torch
import torch.nn.functional as F
import transformers

from models import bert as bert_jax
from models.pytorch import peer as peer_lib


def bert_config(cfg: peer_lib.Config) -> transformers.BertConfig:
  """The BertConfig of a JAX BERT config (models/bert.BertEncoder)."""
  return transformers.BertConfig(
    vocab_size=cfg['vocab'],
    hidden_size=cfg['hidden'],
    num_hidden_layers=cfg['layers'],
    num_attention_heads=cfg['heads'],
    intermediate_size=cfg['ffn'],
    max_position_embeddings=cfg['max_positions'],
    type_vocab_size=cfg['type_vocab'],
    hidden_dropout_prob=cfg['dropout'],
    attention_probs_dropout_prob=cfg['dropout'],
    hidden_act='gelu',  # the erf form, as models/bert.gelu
    layer_norm_eps=bert_jax.LN_EPS,
    pad_token_id=bert_jax.PAD,
    attn_implementation='sdpa',
  )


def warmup_linear(lr: float, warmup: int, total: int):
  """The learning rate at update `count` (from 0): linear from 0 to `lr` over `warmup` updates,
  then linear to 0 at `total`, as optax.join_schedules of two linear_schedules."""

  def at(count: int) -> float:
    if count < warmup:
      return lr * count / warmup
    return lr * max(0.0, 1.0 - (count - warmup) / max(total - warmup, 1))

  return at


class ScheduledAdamW(torch.optim.AdamW):
  """AdamW whose learning rate follows `schedule` at its own update count, as optax's schedules
  do: the first update takes schedule(0). On CUDA it is the fused kernel, into which the gradient
  scaler folds its overflow check: a step skipped there still counts, where the JAX workload's
  skipped step does not (the schedule then runs one update ahead of the JAX one)."""

  def __init__(self, params, schedule, **kwargs):
    super().__init__(params, lr=schedule(0), **kwargs)
    self.schedule = schedule
    self.updates = 0

  def step(self, closure=None):
    lr = self.schedule(self.updates)
    for group in self.param_groups:
      group['lr'] = lr
    self.updates += 1
    return super().step(closure)


def adamw(model: torch.nn.Module, cfg: peer_lib.Config, device: torch.device) -> ScheduledAdamW:
  """models/bert.adamw: b1 0.9, b2 0.999, eps 1e-6, weight decay 0.01 on every weight but
  biases and LayerNorms (embeddings decay), BERT's warm-up then linear decay."""
  decay, exempt = [], []
  norms = {
    id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()
  }
  for name, p in model.named_parameters():
    (exempt if name.endswith('bias') or id(p) in norms else decay).append(p)
  return ScheduledAdamW(
    [{'params': decay, 'weight_decay': 0.01}, {'params': exempt, 'weight_decay': 0.0}],
    warmup_linear(cfg['lr'], cfg['warmup'], cfg['total_steps']),
    betas=(0.9, 0.999),
    eps=1e-6,
    fused=device.type == 'cuda',
  )


def cross_entropy(logits, labels):
  """Mean softmax cross-entropy in float32, as models/bert.cross_entropy."""
  return F.cross_entropy(logits.float(), labels.long())


def _randint(low, high, size, generator, device):
  return torch.randint(low, high, size, generator=generator, device=device, dtype=torch.int32)


# --- BERT-base pretraining ---


def pretraining_batch(cfg, n, generator, device):
  """models/bert.make_batch: full-length pairs, `masked` distinct positions (never [CLS])."""
  length, masked = cfg['seq_len'], cfg['masked']
  tokens = _randint(1, cfg['vocab'], (n, length), generator, device)
  segments = (torch.arange(length, device=device) >= length // 2).to(torch.int32).repeat(n, 1)
  scores = torch.rand((n, length - 1), generator=generator, device=device)
  positions = 1 + scores.topk(masked, dim=1).indices.to(torch.int32)
  return {
    'tokens': tokens,
    'segments': segments,
    'masked_positions': positions,
    'masked_ids': _randint(1, cfg['vocab'], (n, masked), generator, device),
    'masked_weights': torch.ones((n, masked), device=device),
    'next_sentence': _randint(0, 2, (n,), generator, device),
  }


def pretraining_loss(model: transformers.BertForPreTraining, batch) -> torch.Tensor:
  """models/bert.pretraining_loss: MLM over the gathered masked positions, plus NSP.

  The heads (BertPreTrainingHeads: transform, LayerNorm, the decoder tied to the word
  embeddings with its own bias; NSP on the pooler) run on the masked positions only, so the
  vocabulary projection covers `masked` positions per sequence, not all of them as
  BertForPreTraining.forward does.
  """
  out = model.bert(input_ids=batch['tokens'], token_type_ids=batch['segments'])
  hidden_BxLxH = out.last_hidden_state
  positions_BxP = batch['masked_positions'].long()
  picked_BxPxH = hidden_BxLxH.gather(
    1, positions_BxP[..., None].expand(-1, -1, hidden_BxLxH.shape[-1])
  )
  mlm_logits_BxPxV, nsp_logits_Bx2 = model.cls(picked_BxPxH, out.pooler_output)
  weights = batch['masked_weights'].flatten()
  per_position = F.cross_entropy(
    mlm_logits_BxPxV.flatten(0, 1).float(), batch['masked_ids'].flatten().long(), reduction='none'
  )
  mlm = (per_position * weights).sum() / weights.sum().clamp(min=1.0)
  return mlm + cross_entropy(nsp_logits_Bx2, batch['next_sentence'])


def build_pretraining(cfg, device) -> peer_lib.Setup:
  with torch.device(device):
    model = transformers.BertForPreTraining(bert_config(cfg))
  model.train()
  update = peer_lib.Update(
    lambda batch, step: pretraining_loss(model, batch), adamw(model, cfg, device)
  )
  return peer_lib.Setup(modules={'bert': model}, updates=[update])


BERT_BASE = peer_lib.Peer(
  name='bert_base',
  build=build_pretraining,
  make_batch=pretraining_batch,
  source='transformers BertModel + BertPreTrainingHeads (sdpa), heads on the masked positions',
)


# --- SQuAD 1.1 fine-tuning ---


def squad_batch(cfg, n, generator, device):
  """models/bert.squad_batch: [CLS] question [SEP] context [SEP], a short span in the context."""
  length, question = cfg['seq_len'], cfg['question_len']
  tokens = _randint(1, cfg['vocab'], (n, length), generator, device)
  segments = (torch.arange(length, device=device) >= question).to(torch.int32).repeat(n, 1)
  start = _randint(question, length - 1, (n,), generator, device)
  span = _randint(0, cfg['max_answer_len'], (n,), generator, device)
  end = torch.clamp(start + span, max=length - 2)
  return {'tokens': tokens, 'segments': segments, 'start_positions': start, 'end_positions': end}


def squad_loss(model: transformers.BertForQuestionAnswering, batch) -> torch.Tensor:
  """models/bert.squad_loss: (CE(start) + CE(end)) / 2."""
  out = model(input_ids=batch['tokens'], token_type_ids=batch['segments'])
  start = cross_entropy(out.start_logits, batch['start_positions'])
  end = cross_entropy(out.end_logits, batch['end_positions'])
  return (start + end) / 2


def build_squad(cfg, device) -> peer_lib.Setup:
  with torch.device(device):
    model = transformers.BertForQuestionAnswering(bert_config(cfg))  # no pooler, as BertSquad
  model.train()
  update = peer_lib.Update(lambda batch, step: squad_loss(model, batch), adamw(model, cfg, device))
  return peer_lib.Setup(modules={'bert': model}, updates=[update])


BERT_SQUAD = peer_lib.Peer(
  name='bert_squad',
  build=build_squad,
  make_batch=squad_batch,
  source='transformers BertForQuestionAnswering (sdpa)',
)
