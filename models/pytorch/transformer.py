"""The PyTorch peer of transformer_big: fairseq's transformer_vaswani_wmt_en_de_big in torch.nn.

Post-norm encoder-decoder layers, one embedding shared by the encoder, the decoder and the output
projection (scaled by sqrt(d_model)), fairseq's sinusoidal positions, attention through
scaled_dot_product_attention, label-smoothed cross-entropy and Adam with fairseq's inverse_sqrt
schedule, at the config of models/transformer.py.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from models import transformer as jax_transformer
from models.pytorch import peer as peer_lib

PAD = jax_transformer.PAD
EOS = 2  # the decoder input starts with it, as fairseq's


class Attention(nn.Module):
  """Multi-head attention with separate query, key, value and output projections (with bias)."""

  def __init__(self, d: int, heads: int):
    super().__init__()
    self.heads = heads
    self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))
    for layer in (self.q, self.k, self.v, self.out):
      nn.init.xavier_uniform_(layer.weight)  # fairseq's init
      nn.init.zeros_(layer.bias)

  def forward(self, x_BxLxD, memory_BxSxD, mask_Bx1xLxS):
    split = lambda t: t.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # B x H x L x D/H
    y = F.scaled_dot_product_attention(
      split(self.q(x_BxLxD)),
      split(self.k(memory_BxSxD)),
      split(self.v(memory_BxSxD)),
      attn_mask=mask_Bx1xLxS,
    )
    return self.out(y.transpose(1, 2).flatten(2))


class Layer(nn.Module):
  """A post-layer-norm layer: x = LayerNorm(x + Dropout(sublayer(x))) after each sub-block."""

  def __init__(self, d: int, ffn: int, heads: int, dropout: float, cross_attention: bool):
    super().__init__()
    self.self_attention = Attention(d, heads)
    self.self_attention_norm = nn.LayerNorm(d, eps=1e-5)
    if cross_attention:
      self.cross_attention = Attention(d, heads)
      self.cross_attention_norm = nn.LayerNorm(d, eps=1e-5)
    self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
    for layer in (self.fc1, self.fc2):
      nn.init.xavier_uniform_(layer.weight)
      nn.init.zeros_(layer.bias)
    self.ffn_norm = nn.LayerNorm(d, eps=1e-5)
    self.drop = nn.Dropout(dropout)

  def forward(self, x, self_mask, memory=None, memory_mask=None):
    x = self.self_attention_norm(x + self.drop(self.self_attention(x, x, self_mask)))
    if memory is not None:
      y = self.cross_attention(x, memory, memory_mask)
      x = self.cross_attention_norm(x + self.drop(y))
    return self.ffn_norm(x + self.drop(self.fc2(F.relu(self.fc1(x)))))


def sinusoidal_positions(length: int, dim: int, device) -> torch.Tensor:
  """fairseq's sinusoidal embedding: sines in the first half, cosines in the second."""
  half = dim // 2
  inv_freq = torch.exp(
    torch.arange(half, dtype=torch.float32, device=device) * -(math.log(10000.0) / (half - 1))
  )
  angles = torch.arange(length, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
  return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


class TransformerBig(nn.Module):
  """Encoder-decoder with source, target and output embeddings shared; returns the logits."""

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    d = cfg['d_model']
    self.d = d
    self.shared_embedding = nn.Embedding(cfg['vocab'], d)
    nn.init.normal_(self.shared_embedding.weight, std=d**-0.5)
    self.drop = nn.Dropout(cfg['dropout'])
    layer = lambda cross: Layer(d, cfg['ffn'], cfg['heads'], cfg['dropout'], cross)
    self.encoder = nn.ModuleList(layer(False) for _ in range(cfg['encoder_layers']))
    self.decoder = nn.ModuleList(layer(True) for _ in range(cfg['decoder_layers']))

  def _embed(self, tokens_BxL):
    x = self.shared_embedding(tokens_BxL) * math.sqrt(self.d)  # fairseq scales by sqrt(d)
    x = x + sinusoidal_positions(tokens_BxL.shape[1], self.d, tokens_BxL.device)
    return self.drop(x)

  def forward(self, source_BxS, target_in_BxT):
    # Boolean masks, True where attention may look: padded keys are hidden, and the decoder's
    # self-attention is causal.
    src_keys = (source_BxS != PAD)[:, None, None, :]
    tgt_keys = (target_in_BxT != PAD)[:, None, None, :]
    t = target_in_BxT.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=target_in_BxT.device).tril()
    x = self._embed(source_BxS)
    for layer in self.encoder:
      x = layer(x, src_keys)
    memory_BxSxD = x
    y = self._embed(target_in_BxT)
    for layer in self.decoder:
      y = layer(y, tgt_keys & causal, memory_BxSxD, src_keys)
    return F.linear(y, self.shared_embedding.weight)  # logits_BxTxV


def label_smoothed_nll(logits_BxTxV, targets_BxT, epsilon, weights_BxT):
  """fairseq's label_smoothed_cross_entropy: (1-eps)*nll + eps/V * sum(-log p), per token,
  averaged over the tokens of weight 1 (the non-padding targets)."""
  logp = F.log_softmax(logits_BxTxV.float(), dim=-1)
  nll = -logp.gather(-1, targets_BxT.long()[..., None])[..., 0]
  smooth = -logp.sum(dim=-1)
  per_token = (1.0 - epsilon) * nll + (epsilon / logp.shape[-1]) * smooth
  return (per_token * weights_BxT).sum() / weights_BxT.sum().clamp(min=1.0)


def inverse_sqrt(lr: float, warmup: int, warmup_init_lr: float = 1e-7):
  """The learning rate at 0-based step s, as models/transformer.inverse_sqrt."""

  def schedule(s: int) -> float:
    s += 1
    if s < warmup:
      return warmup_init_lr + (lr - warmup_init_lr) * s / warmup
    return lr * math.sqrt(warmup / s)

  return schedule


def build(cfg: peer_lib.Config, device: torch.device) -> peer_lib.Setup:
  with torch.device(device):
    model = TransformerBig(cfg)
  model.train()
  optimizer = torch.optim.Adam(model.parameters(), lr=cfg['lr'], betas=(0.9, 0.98), eps=1e-8)
  schedule = inverse_sqrt(cfg['lr'], cfg['warmup'])
  scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule(s) / cfg['lr'])

  def loss(batch, step):
    del step
    logits = model(batch['source'], batch['target_in'])
    weights = (batch['target'] != PAD).float()
    return label_smoothed_nll(logits, batch['target'], cfg['label_smoothing'], weights)

  return peer_lib.Setup(
    modules={'transformer': model},
    updates=[peer_lib.Update(loss, optimizer)],
    after_step=scheduler.step,
  )


def make_batch(cfg, n, generator, device):
  """n sentence pairs of fixed length, tokens in [1, vocab) (never PAD), int32 as JAX's."""
  draw = lambda length: torch.randint(
    1, cfg['vocab'], (n, length), generator=generator, device=device, dtype=torch.int32
  )
  source, target = draw(cfg['src_len']), draw(cfg['tgt_len'])
  eos = torch.full((n, 1), EOS, dtype=torch.int32, device=device)
  return {
    'source': source,
    'target_in': torch.cat([eos, target[:, :-1]], dim=1),
    'target': target,
  }


TRANSFORMER_BIG = peer_lib.Peer(
  name='transformer_big',
  build=build,
  make_batch=make_batch,
  source='written from torch.nn layers (fairseq transformer_vaswani_wmt_en_de_big); '
  'attention through F.scaled_dot_product_attention',
  loss_scale=jax_transformer.FAIRSEQ_LOSS_SCALE,
)
