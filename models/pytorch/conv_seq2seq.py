"""The PyTorch peer of conv_seq2seq: fairseq's fconv_wmt_en_de (ConvS2S) in torch.nn.

Gated convolutional encoder and causal decoder over time-major [T, B, C] activations, as fairseq
keeps them, each convolution weight-normalised and computed as ConvTBC computes it: one GEMM per
kernel tap on a shifted view of the padded input. Multi-step attention in every decoder layer,
learned positions, label-smoothed cross-entropy and Nesterov momentum after clipping the global
gradient norm, at the config of models/conv_seq2seq/fconv.py.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.conv_seq2seq import fconv as jax_fconv
from models.pytorch import peer as peer_lib
from models.pytorch import transformer as peer_transformer

PAD = jax_fconv.PAD
EOS = jax_fconv.EOS
SQRT_HALF = math.sqrt(0.5)


def _norm_except(v: torch.Tensor, dim: int) -> torch.Tensor:
  """||v|| over every axis but `dim`, shaped to broadcast against v."""
  axes = [a for a in range(v.dim()) if a != dim]
  return v.norm(dim=axes, keepdim=True)


class WeightNormLinear(nn.Module):
  """w = g * v / ||v|| (per output), fairseq's Linear: v ~ N(0, (1 - dropout) / in), g = ||v||."""

  def __init__(self, d_in: int, d_out: int, dropout: float = 0.0):
    super().__init__()
    self.v = nn.Parameter(torch.empty(d_out, d_in))
    nn.init.normal_(self.v, std=math.sqrt((1.0 - dropout) / d_in))
    self.g = nn.Parameter(_norm_except(self.v.detach(), 0)[:, 0].clone())
    self.bias = nn.Parameter(torch.zeros(d_out))

  def forward(self, x):
    w = self.v * (self.g[:, None] / _norm_except(self.v, 0))
    return F.linear(x, w, self.bias)


class WeightNormConvTBC(nn.Module):
  """A weight-normalised temporal convolution on [T, B, C], fairseq's ConvTBC.

  The kernel is K x Cin x Cout with the norm per output channel. Output t is
  sum_j x[t + j - left] @ w[j], zero outside the sequence; left = K-1 when causal (the output
  sees inputs <= t), else K//2. Each tap is one GEMM on a contiguous slice of the padded
  input, as ConvTBC's kernel does, so the backward pass keeps only the padded input and the
  kernel.
  """

  def __init__(self, d_in: int, d_out: int, kernel: int, causal: bool, dropout: float):
    super().__init__()
    self.kernel, self.causal = kernel, causal
    self.v = nn.Parameter(torch.empty(kernel, d_in, d_out))
    nn.init.normal_(self.v, std=math.sqrt(4.0 * (1.0 - dropout) / (kernel * d_in)))
    self.g = nn.Parameter(_norm_except(self.v.detach(), 2)[0, 0].clone())
    self.bias = nn.Parameter(torch.zeros(d_out))

  def forward(self, x_TxBxC):
    k = self.kernel
    w_KxCxD = self.v * (self.g / _norm_except(self.v, 2))
    left = k - 1 if self.causal else k // 2
    t, b, c = x_TxBxC.shape
    padded = F.pad(x_TxBxC, (0, 0, 0, 0, left, k - 1 - left)).reshape(-1, c)
    out = self.bias.to(x_TxBxC.dtype).expand(t * b, -1)
    for j in range(k):
      out = torch.addmm(out, padded[j * b : (j + t) * b], w_KxCxD[j].to(x_TxBxC.dtype))
    return out.view(t, b, -1)


class GradMultiply(torch.autograd.Function):
  """Identity forward; the gradient times `scale` (fairseq's GradMultiply)."""

  @staticmethod
  def forward(ctx, x, scale):
    ctx.scale = scale
    return x.view_as(x)

  @staticmethod
  def backward(ctx, grad):
    return grad * ctx.scale, None


class Attention(nn.Module):
  """fairseq's AttentionLayer: one-head dot-product attention from a decoder block.

  Queries in_projection(x) plus the target embedding, keys the encoder output, values the
  encoder output plus the source embedding; the context is scaled by sqrt(source length),
  projected back and added to x, each sum scaled by sqrt(0.5).
  """

  def __init__(self, channels: int, embed_dim: int):
    super().__init__()
    self.in_projection = WeightNormLinear(channels, embed_dim)
    self.out_projection = WeightNormLinear(embed_dim, channels)

  def forward(self, x_TxBxC, target_embedding_TxBxE, keys_BxSxE, values_BxSxE, src_valid_BxS):
    q_BxTxE = ((self.in_projection(x_TxBxC) + target_embedding_TxBxE) * SQRT_HALF).transpose(0, 1)
    scores = torch.bmm(q_BxTxE, keys_BxSxE.transpose(1, 2)).float()
    scores = scores.masked_fill(~src_valid_BxS[:, None, :], float('-inf'))
    probs = F.softmax(scores, dim=-1).to(values_BxSxE.dtype)
    context_BxTxE = torch.bmm(probs, values_BxSxE)
    src_len = src_valid_BxS.sum(dim=1).to(context_BxTxE.dtype)
    context_BxTxE = context_BxTxE * src_len.sqrt()[:, None, None]  # s * sqrt(1/s)
    y = self.out_projection(context_BxTxE.transpose(0, 1))
    return (y + x_TxBxC) * SQRT_HALF


class ConvStack(nn.Module):
  """The gated convolution blocks: dropout, convolution to 2C, GLU, [attention], then
  (x + residual) * sqrt(0.5), the residual projected where the width changes."""

  def __init__(self, channels, layers, dropout, causal, attention_dim=0):
    super().__init__()
    self.projections, self.convs, self.attentions = (nn.ModuleList() for _ in range(3))
    for out, kernel in layers:
      self.projections.append(WeightNormLinear(channels, out) if channels != out else nn.Identity())
      self.convs.append(WeightNormConvTBC(channels, 2 * out, kernel, causal, dropout))
      if attention_dim:
        self.attentions.append(Attention(out, attention_dim))
      channels = out
    self.drop = nn.Dropout(dropout)

  def forward(self, x_TxBxC, valid_TxB=None, target_embedding=None, encoder_out=None):
    for i, conv in enumerate(self.convs):
      residual = self.projections[i](x_TxBxC)
      if valid_TxB is not None:  # the encoder zeroes padded steps before every convolution
        x_TxBxC = x_TxBxC.masked_fill(~valid_TxB[..., None], 0.0)
      x_TxBxC = F.glu(conv(self.drop(x_TxBxC)), dim=-1)
      if self.attentions:
        x_TxBxC = self.attentions[i](x_TxBxC, target_embedding, *encoder_out)
      x_TxBxC = (x_TxBxC + residual) * SQRT_HALF
    return x_TxBxC


class Embeddings(nn.Module):
  """Token plus learned position embeddings, both N(0, 0.1); positions count from PAD + 1 and
  padded tokens take position PAD, as fairseq's make_positions."""

  def __init__(self, vocab: int, dim: int, max_positions: int):
    super().__init__()
    self.tokens = nn.Embedding(vocab, dim)
    self.positions = nn.Embedding(max_positions, dim)
    for table in (self.tokens, self.positions):
      nn.init.normal_(table.weight, std=0.1)

  def forward(self, tokens_TxB):
    valid = tokens_TxB != PAD
    steps = torch.arange(tokens_TxB.shape[0], device=tokens_TxB.device)[:, None] + PAD + 1
    positions = torch.where(valid, steps, PAD)
    return self.tokens(tokens_TxB) + self.positions(positions)


class FConv(nn.Module):
  """fairseq's FConvModel: convolutional encoder, causal convolutional decoder with attention;
  returns the logits [B, T, V]."""

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    e, p = cfg['embed_dim'], cfg['dropout']
    layers = tuple(tuple(layer) for layer in cfg['layers'])
    first, last = layers[0][0], layers[-1][0]
    self.grad_scale = 1.0 / (2.0 * len(layers))
    self.drop = nn.Dropout(p)
    self.encoder_embed = Embeddings(cfg['src_vocab'], e, cfg['max_positions'])
    self.encoder_fc1 = WeightNormLinear(e, first, p)
    self.encoder = ConvStack(first, layers, p, causal=False)
    self.encoder_fc2 = WeightNormLinear(last, e)
    self.decoder_embed = Embeddings(cfg['tgt_vocab'], e, cfg['max_positions'])
    self.decoder_fc1 = WeightNormLinear(e, first, p)
    self.decoder = ConvStack(first, layers, p, causal=True, attention_dim=e)
    self.decoder_fc2 = WeightNormLinear(last, cfg['decoder_out_embed_dim'])
    self.decoder_fc3 = WeightNormLinear(cfg['decoder_out_embed_dim'], cfg['tgt_vocab'], p)

  def forward(self, source_BxS, target_in_BxT):
    src_TxB, tgt_TxB = source_BxS.t(), target_in_BxT.t()
    src_valid_TxB = src_TxB != PAD
    src_embedding = self.drop(self.encoder_embed(src_TxB))
    x = self.encoder(self.encoder_fc1(src_embedding), src_valid_TxB)
    x = self.encoder_fc2(x).masked_fill(~src_valid_TxB[..., None], 0.0)
    # Every decoder layer attends to the encoder: its gradients are scaled by
    # 1 / (2 * number of attention layers) so that they do not grow with depth.
    keys_SxBxE = GradMultiply.apply(x, self.grad_scale)
    values_SxBxE = (keys_SxBxE + src_embedding) * SQRT_HALF
    encoder_out = (keys_SxBxE.transpose(0, 1), values_SxBxE.transpose(0, 1), src_valid_TxB.t())
    tgt_embedding = self.drop(self.decoder_embed(tgt_TxB))
    y = self.decoder(self.decoder_fc1(tgt_embedding), None, tgt_embedding, encoder_out)
    y = self.drop(self.decoder_fc2(y))
    return self.decoder_fc3(y).transpose(0, 1)  # logits_BxTxV


def build(cfg: peer_lib.Config, device: torch.device) -> peer_lib.Setup:
  with torch.device(device):
    model = FConv(cfg)
  model.train()
  # fairseq's nag at a fixed learning rate is torch's Nesterov SGD (as optax's).
  optimizer = torch.optim.SGD(
    model.parameters(), lr=cfg['lr'], momentum=cfg['momentum'], nesterov=True
  )

  def loss(batch, step):
    del step
    logits = model(batch['source'], batch['target_in'])
    weights = (batch['target'] != PAD).float()
    return peer_transformer.label_smoothed_nll(
      logits, batch['target'], cfg['label_smoothing'], weights
    )

  return peer_lib.Setup(
    modules={'fconv': model},
    updates=[peer_lib.Update(loss, optimizer, clip_norm=cfg['clip_norm'])],
  )


def make_batch(cfg, n, generator, device):
  """n sentence pairs of fixed length, tokens in [PAD + 1, vocab) of each side, int32."""
  draw = lambda length, vocab: torch.randint(
    PAD + 1, vocab, (n, length), generator=generator, device=device, dtype=torch.int32
  )
  source = draw(cfg['src_len'], cfg['src_vocab'])
  target = draw(cfg['tgt_len'], cfg['tgt_vocab'])
  eos = torch.full((n, 1), EOS, dtype=torch.int32, device=device)
  return {
    'source': source,
    'target_in': torch.cat([eos, target[:, :-1]], dim=1),
    'target': target,
  }


CONV_SEQ2SEQ = peer_lib.Peer(
  name='conv_seq2seq',
  build=build,
  make_batch=make_batch,
  source='written from torch.nn layers (fairseq fconv_wmt_en_de); weight-normalised '
  'convolutions as one GEMM per tap on time-major activations, as fairseq ConvTBC',
)
