"""The PyTorch peer of unsupmt: XLM's unsupervised MT (denoising auto-encoding + back-translation).

XLM's TransformerModel pair in torch.nn, as models/unsupmt/: post-LN layers with erf GELU,
learned position and language embeddings under a LayerNorm, hidden states zeroed on padding,
separate encoder and decoder parameters, the decoder's output projection its input embedding
plus a bias. One iteration is four optimizer updates in XLM's order: denoising auto-encoding in
en, then in fr, then back-translation en-fr-en and fr-en-fr, each generating its source greedily
under torch.no_grad (a KV cache per decoder layer) inside the loss, before the forward that
trains. One Adam (0.9, 0.98) on the inverse_sqrt schedule, advanced by every update, after
clipping the global norm of all parameters, as the JAX workload's one optax chain.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

from models.pytorch import peer as peer_lib
from models.pytorch import transformer as pt_transformer
from models.unsupmt import xlm as jax_xlm
from models.unsupmt.noise import EOS, FIRST_WORD, MASK, PAD

EN, FR = jax_xlm.EN, jax_xlm.FR
LN_EPS = 1e-12  # XLM's LayerNorm epsilon


def _dense(fan_in: int, fan_out: int) -> nn.Linear:
  """nn.Linear initialized as flax's Dense (the JAX workload's): LeCun truncated normal, zero
  bias."""
  layer = nn.Linear(fan_in, fan_out)
  std = math.sqrt(1.0 / fan_in) / 0.87962566103423978  # the truncated normal's std correction
  nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
  nn.init.zeros_(layer.bias)
  return layer


class Attention(nn.Module):
  """XLM's MultiHeadAttention: q/k/v/out projections, dropout on the attention weights."""

  def __init__(self, d: int, heads: int, dropout: float):
    super().__init__()
    self.heads, self.dropout = heads, dropout
    self.q_lin, self.k_lin, self.v_lin, self.out_lin = (_dense(d, d) for _ in range(4))

  def split(self, x_BxLxD):
    return x_BxLxD.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # B x H x L x Dh

  def kv(self, x_BxKxD):
    return self.split(self.k_lin(x_BxKxD)), self.split(self.v_lin(x_BxKxD))

  def forward(self, x_BxQxD, k_BxHxKxDh, v_BxHxKxDh, mask, train: bool, is_causal=False):
    y = F.scaled_dot_product_attention(
      self.split(self.q_lin(x_BxQxD)),
      k_BxHxKxDh,
      v_BxHxKxDh,
      attn_mask=mask,
      dropout_p=self.dropout if train else 0.0,
      is_causal=is_causal,
    )
    return self.out_lin(y.transpose(1, 2).flatten(2))


class Layer(nn.Module):
  """One post-LN layer: self-attention, cross-attention (decoder), FFN with erf GELU."""

  def __init__(self, cfg: peer_lib.Config, cross: bool):
    super().__init__()
    d, self.p = cfg['d_model'], cfg['dropout']
    attention = lambda: Attention(d, cfg['heads'], cfg['attention_dropout'])
    self.attention, self.layer_norm1 = attention(), nn.LayerNorm(d, eps=LN_EPS)
    if cross:
      self.encoder_attn, self.layer_norm15 = attention(), nn.LayerNorm(d, eps=LN_EPS)
    self.fc1, self.fc2 = _dense(d, cfg['ffn']), _dense(cfg['ffn'], d)
    self.layer_norm2 = nn.LayerNorm(d, eps=LN_EPS)

  def forward(self, x, mask, train, kv=None, cross=None, is_causal=False):
    """kv: this layer's self-attention keys and values (a cache), else computed from x."""
    drop = lambda y: F.dropout(y, self.p, train)
    k, v = self.attention.kv(x) if kv is None else kv
    x = self.layer_norm1(x + drop(self.attention(x, k, v, mask, train, is_causal)))
    if cross is not None:
      memory_k, memory_v, memory_mask = cross
      x = self.layer_norm15(x + drop(self.encoder_attn(x, memory_k, memory_v, memory_mask, train)))
    return self.layer_norm2(x + drop(self.fc2(F.gelu(self.fc1(x)))))


class Transformer(nn.Module):
  """XLM's TransformerModel: the encoder, or the decoder with its output layer."""

  def __init__(self, cfg: peer_lib.Config, is_decoder: bool):
    super().__init__()
    d, self.p = cfg['d_model'], cfg['dropout']
    self.embeddings = nn.Embedding(cfg['vocab'], d)
    self.position_embeddings = nn.Embedding(cfg['max_positions'], d)
    self.lang_embeddings = nn.Embedding(cfg['n_langs'], d)
    for e in (self.embeddings, self.position_embeddings, self.lang_embeddings):
      nn.init.normal_(e.weight, std=d**-0.5)
    self.layer_norm_emb = nn.LayerNorm(d, eps=LN_EPS)
    self.layers = nn.ModuleList(Layer(cfg, is_decoder) for _ in range(cfg['layers']))
    if is_decoder:
      self.pred_bias = nn.Parameter(torch.zeros(cfg['vocab']))

  def _embed(self, tokens_BxL, first_position: int, lang: int, train: bool):
    positions = torch.arange(
      first_position, first_position + tokens_BxL.shape[1], device=tokens_BxL.device
    )
    x = (
      self.embeddings(tokens_BxL)
      + self.position_embeddings(positions)[None]
      + self.lang_embeddings.weight[lang]
    )
    return F.dropout(self.layer_norm_emb(x), self.p, train)

  def encode(self, tokens_BxS, lang: int, train: bool):
    valid = (tokens_BxS != PAD)[..., None]
    x = self._embed(tokens_BxS, 0, lang, train) * valid
    mask = (tokens_BxS != PAD)[:, None, None, :]
    for layer in self.layers:
      x = layer(x, mask, train) * valid
    return x

  def memory_kv(self, memory_BxSxD):
    return [layer.encoder_attn.kv(memory_BxSxD) for layer in self.layers]

  def decode(self, tokens_BxT, lang: int, memory_BxSxD, src_valid_BxS, train: bool):
    """Teacher-forced logits, BxTxV. As XLM's, the causal mask ignores target padding: padded
    rows are zeroed after each layer."""
    valid = (tokens_BxT != PAD)[..., None]
    x = self._embed(tokens_BxT, 0, lang, train) * valid
    memory_mask = src_valid_BxS[:, None, None, :]
    for layer, (k, v) in zip(self.layers, self.memory_kv(memory_BxSxD)):
      x = layer(x, None, train, cross=(k, v, memory_mask), is_causal=True) * valid
    return self.logits(x)

  def decode_step(self, token_Bx1, index: int, lang: int, cache, memory_kv, src_valid_BxS):
    """The next-token logits (BxV) of position `index`; writes its keys and values into
    `cache` (per layer, B x H x length x Dh) and attends over positions 0..index."""
    x = self._embed(token_Bx1, index, lang, train=False)
    memory_mask = src_valid_BxS[:, None, None, :]
    for layer, (cache_k, cache_v), (k, v) in zip(self.layers, cache, memory_kv):
      new_k, new_v = layer.attention.kv(x)
      cache_k[:, :, index : index + 1] = new_k
      cache_v[:, :, index : index + 1] = new_v
      kv = (cache_k[:, :, : index + 1], cache_v[:, :, : index + 1])
      x = layer(x, None, False, kv=kv, cross=(k, v, memory_mask))
    return self.logits(x)[:, 0]

  def logits(self, x_BxTxD):
    return F.linear(x_BxTxD, self.embeddings.weight, self.pred_bias)


class EncoderDecoder(nn.Module):
  """The MT model: an encoder and a decoder with separate parameters, as XLM builds them."""

  def __init__(self, cfg: peer_lib.Config):
    super().__init__()
    self.encoder = Transformer(cfg, is_decoder=False)
    self.decoder = Transformer(cfg, is_decoder=True)

  def forward(self, src_BxS, src_lang: int, tgt_in_BxT, tgt_lang: int, train: bool = True):
    memory = self.encoder.encode(src_BxS, src_lang, train)
    return self.decoder.decode(tgt_in_BxT, tgt_lang, memory, src_BxS != PAD, train)


@torch.compiler.disable
@torch.no_grad()
def generate(model: EncoderDecoder, src_BxS, src_lang: int, tgt_lang: int, length: int):
  """XLM's greedy generate, without dropout: B x length tokens, `EOS words EOS PAD..`.

  torch.compile leaves it eager: its stop test is a branch on the device's data, on which Dynamo
  breaks the graph, and each step's cache length a shape of its own, for which it recompiles.

  Stops when every sentence has produced EOS (XLM's `break`), else after length - 1 steps;
  sentences still open then get EOS in the last column, as models/unsupmt/xlm.generate. Each
  step attends over the cache's written positions (the JAX workload masks a fixed-length
  cache: the same tokens), and the stop test reads the device once a step, as XLM's does.
  """
  decoder = model.decoder
  memory_kv = decoder.memory_kv(model.encoder.encode(src_BxS, src_lang, False))
  batch, device = src_BxS.shape[0], src_BxS.device
  k0 = memory_kv[0][0]
  shape = (batch, k0.shape[1], length, k0.shape[3])
  cache = [(k0.new_empty(shape), k0.new_empty(shape)) for _ in memory_kv]
  tokens = torch.full((batch, length), PAD, dtype=src_BxS.dtype, device=device)
  tokens[:, 0] = EOS
  unfinished = torch.ones(batch, dtype=torch.bool, device=device)
  src_valid = src_BxS != PAD
  for t in range(1, length):
    logits = decoder.decode_step(tokens[:, t - 1 : t], t - 1, tgt_lang, cache, memory_kv, src_valid)
    word = logits.float().argmax(dim=-1).to(tokens.dtype)
    tokens[:, t] = torch.where(unfinished, word, PAD)
    unfinished &= word != EOS
    if not unfinished.any():
      break
  tokens[:, -1] = torch.where(unfinished, EOS, tokens[:, -1])
  return tokens


def _word_positions(tokens_BxL):
  """True on the words of each row: after the start EOS, before the closing EOS."""
  j = torch.arange(tokens_BxL.shape[1], device=tokens_BxL.device)[None]
  length = (tokens_BxL != PAD).sum(dim=1, keepdim=True)
  return (j >= 1) & (j < length - 1)


def word_shuffle(tokens_BxL, k: float):
  """Sort the words by position + U(0, k): no word moves by k places or more."""
  if k == 0:
    return tokens_BxL
  j = torch.arange(tokens_BxL.shape[1], device=tokens_BxL.device, dtype=torch.float32)[None]
  noise = torch.rand(tokens_BxL.shape, device=tokens_BxL.device) * k
  # The start symbol keeps 0, the closing EOS and padding j + k: neither moves.
  offset = torch.where(_word_positions(tokens_BxL), noise, torch.where(j == 0, 0.0, k))
  order = torch.sort(j + offset, dim=1, stable=True).indices
  return tokens_BxL.gather(1, order)


def word_dropout(tokens_BxL, p: float):
  """Drop each word with probability p, keeping one random word of a sentence that lost all;
  the row keeps its length, PAD at the end."""
  if p == 0:
    return tokens_BxL
  length, device = tokens_BxL.shape[1], tokens_BxL.device
  j = torch.arange(length, device=device)[None]
  is_word = _word_positions(tokens_BxL)
  drop = is_word & (torch.rand(tokens_BxL.shape, device=device) < p)
  n_words = is_word.sum(dim=1).clamp(min=1)
  pick = 1 + (torch.rand(n_words.shape, device=device) * n_words).long().clamp(max=n_words - 1)
  none_left = ((is_word & ~drop).sum(dim=1) == 0)[:, None]
  drop = drop & ~(none_left & (j == pick[:, None]))
  keep = (tokens_BxL != PAD) & ~drop
  order = torch.sort(torch.where(keep, j, j + length), dim=1, stable=True).indices
  moved = tokens_BxL.gather(1, order)
  return torch.where(j < keep.sum(dim=1, keepdim=True), moved, PAD)


def word_blank(tokens_BxL, p: float):
  """Replace each word with the mask token with probability p."""
  if p == 0:
    return tokens_BxL
  blank = _word_positions(tokens_BxL) & (torch.rand(tokens_BxL.shape, device=tokens_BxL.device) < p)
  return torch.where(blank, MASK, tokens_BxL)


def add_noise(tokens_BxL, cfg: peer_lib.Config):
  """XLM's add_noise: shuffle, then dropout, then blank."""
  x = word_shuffle(tokens_BxL, cfg['word_shuffle'])
  x = word_dropout(x, cfg['word_dropout'])
  return word_blank(x, cfg['word_blank'])


def cross_entropy(logits_BxTxV, targets_BxT):
  """XLM's PredLayer loss: mean cross-entropy over the non-pad targets."""
  per_token = F.cross_entropy(
    logits_BxTxV.float().flatten(0, 1), targets_BxT.long().flatten(), reduction='none'
  )
  weights = (targets_BxT.flatten() != PAD).float()
  return (per_token * weights).sum() / weights.sum().clamp(min=1.0)


def build(cfg: peer_lib.Config, device: torch.device) -> peer_lib.Setup:
  with torch.device(device):
    model = EncoderDecoder(cfg)
  model.train()
  optimizer = torch.optim.Adam(model.parameters(), lr=cfg['lr'], betas=(0.9, 0.98), eps=1e-8)
  schedule = pt_transformer.inverse_sqrt(cfg['lr'], cfg['warmup'])
  scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule(s) / cfg['lr'])
  # The schedule counts optimizer updates, four an iteration, as optax's count in the JAX chain;
  # an update a gradient scaler skips leaves it, as the JAX workload keeps its state then.
  optimizer.register_step_post_hook(lambda *_: scheduler.step())
  gen_len = jax_xlm.max_len(cfg)

  def train_on(src_BxS, src_lang, tgt_BxT, tgt_lang):
    logits = model(src_BxS, src_lang, tgt_BxT[:, :-1], tgt_lang)
    return cross_entropy(logits, tgt_BxT[:, 1:])

  def ae(i):
    lang = (EN, FR)[i]

    def loss(batch, step):
      del step
      sentences = batch['ae'][i]
      return train_on(add_noise(sentences, cfg), lang, sentences, lang)

    return loss

  def bt(i):
    lang1 = (EN, FR)[i]
    lang2 = 1 - lang1

    def loss(batch, step):
      del step
      sentences = batch['bt'][i]
      generated = generate(model, sentences, lang1, lang2, gen_len)
      return train_on(generated, lang2, sentences, lang1)

    return loss

  update = lambda loss: peer_lib.Update(loss, optimizer, clip_norm=cfg['clip_norm'])
  return peer_lib.Setup(
    modules={'encoder': model.encoder, 'decoder': model.decoder},
    updates=[update(ae(0)), update(ae(1)), update(bt(0)), update(bt(1))],
  )


def make_batch(cfg, n, generator, device):
  """Monolingual sentences `EOS w1 .. wL EOS`, words uniform in [FIRST_WORD, vocab), int32:
  'ae' and 'bt' each 2 x n x (L + 2), [en, fr], as the JAX make_batch."""
  words = torch.randint(
    FIRST_WORD,
    cfg['vocab'],
    (4, n, cfg['seq_len']),
    generator=generator,
    device=device,
    dtype=torch.int32,
  )
  eos = torch.full((4, n, 1), EOS, dtype=torch.int32, device=device)
  sentences = torch.cat([eos, words, eos], dim=2)
  return {'ae': sentences[:2], 'bt': sentences[2:]}


UNSUPMT = peer_lib.Peer(
  name='unsupmt',
  build=build,
  make_batch=make_batch,
  source='written from torch.nn layers (facebookresearch/XLM TransformerModel, EncDecTrainer '
  'ae and bt steps); attention through F.scaled_dot_product_attention, greedy generation with '
  'a KV cache',
)
