"""MT-DNN (Liu et al. 2019): a shared BERT-large encoder with one head per GLUE task.

Pair-classification heads are the SAN answer module (Liu, Duh & Gao 2018, "Stochastic Answer
Networks for Natural Language Inference"); the structure and defaults follow namisan/mt-dnn as of
2019 (module/san.py, mt_dnn/matcher.py, train.py, data_utils/label_map.py).
"""

import functools
import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxbench import workload as wl
from models import bert


class Task(NamedTuple):
  name: str
  classes: int  # 1: regression
  head: str  # 'san' (sentence pairs), 'linear' (pooled [CLS]) or 'regression'
  pair: bool  # two segments ([CLS] a [SEP] b [SEP]) or one
  dropout: float  # MT-DNN's per-task dropout (config/tasks_config.json: mnli 0.3, cola 0.05)


# run_mt_dnn.sh's order. MT-DNN's SAN_META enables SAN only for the pair-classification tasks;
# SST-2, CoLA and STS-B score the pooled [CLS] vector with one dense layer.
TASKS = (
  Task('mnli', 3, 'san', True, 0.3),
  Task('rte', 2, 'san', True, 0.1),
  Task('qqp', 2, 'san', True, 0.1),
  Task('qnli', 2, 'san', True, 0.1),
  Task('mrpc', 2, 'san', True, 0.1),
  Task('sst', 2, 'linear', False, 0.1),
  Task('cola', 2, 'linear', False, 0.05),
  Task('stsb', 1, 'regression', True, 0.1),
)
head_init = nn.initializers.normal(0.02)  # MT-DNN's _my_init: N(0, 0.02) weights, zero biases


def torch_uniform(fan):
  """PyTorch's default RNN-cell init, U(-1/sqrt(hidden), 1/sqrt(hidden)); _my_init skips GRUs."""
  bound = 1.0 / math.sqrt(fan)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


class GRUCell(nn.Module):
  """torch.nn.GRUCell: reset, update and candidate gates, biases on input and hidden sides."""

  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x_BxH, h_BxH):
    init = torch_uniform(self.features)
    dense = functools.partial(
      nn.Dense, 3 * self.features, kernel_init=init, bias_init=init, dtype=self.dtype
    )
    i_r, i_z, i_n = jnp.split(dense(name='input')(x_BxH), 3, axis=-1)
    h_r, h_z, h_n = jnp.split(dense(name='hidden')(h_BxH), 3, axis=-1)
    r = nn.sigmoid(i_r + h_r)
    z = nn.sigmoid(i_z + h_z)
    n = jnp.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h_BxH


def masked_softmax(scores_BxL, valid_BxL):
  """Softmax over valid positions, in float32 (the reference fills the rest with -inf)."""
  scores = jnp.where(valid_BxL, scores_BxL.astype(jnp.float32), -jnp.inf)
  return jax.nn.softmax(scores, axis=-1)


def sequence_dropout_mask(rate, batch, features, train, dtype):
  """MT-DNN's variational dropout mask, one per sequence and shared by its positions.

  Since (x * m) @ w = x @ (m * w), callers scale a vector with it instead of masking the
  B x L x H memory.
  """
  return nn.Dropout(rate, deterministic=not train)(jnp.ones((batch, features), dtype))


class SanTurn(nn.Module):
  """One SAN reasoning step: attend the memory with the state, score, advance the GRU."""

  classes: int
  dropout: float
  train: bool
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, s_BxH, hidden_BxLxH, second_BxL):
    batch, _, h = hidden_BxLxH.shape
    drop = nn.Dropout(self.dropout, deterministic=not self.train)
    # Bilinear attention x_l' W s over the second segment (dropout on both sides).
    wy_BxH = nn.Dense(h, kernel_init=head_init, dtype=self.dtype, name='bilinear')(drop(s_BxH))
    wy_BxH = wy_BxH * sequence_dropout_mask(self.dropout, batch, h, self.train, self.dtype)
    att_BxL = masked_softmax(jnp.einsum('blh,bh->bl', hidden_BxLxH, wy_BxH), second_BxL)
    x_sum_BxH = jnp.einsum('bl,blh->bh', att_BxL.astype(self.dtype), hidden_BxLxH)
    features = jnp.concatenate(
      [x_sum_BxH, s_BxH, jnp.abs(x_sum_BxH - s_BxH), x_sum_BxH * s_BxH], axis=-1
    )
    logits_BxC = nn.Dense(self.classes, kernel_init=head_init, dtype=self.dtype, name='classifier')(
      drop(features)
    )
    s_BxH = GRUCell(h, self.dtype, name='gru')(x_sum_BxH, drop(s_BxH))
    return s_BxH, logits_BxC.astype(jnp.float32)


class SanClassifier(nn.Module):
  """SAN answer module: a GRU state reads the second segment for `turns` steps.

  The initial state is a linear self-attention summary of the first segment; each turn a
  bilinear attention of the state over the second segment gives x_sum, the turn's logits come
  from [x_sum, s, |x_sum - s|, x_sum * s], and the GRU takes x_sum to the next state. Training
  averages the turns' probabilities under stochastic prediction dropout (answer_mem_type 1).
  Returns log-probabilities, which MT-DNN feeds to cross-entropy as logits.
  """

  classes: int
  dropout: float
  turns: int = 5
  mem_drop: float = 0.1
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, hidden_BxLxH, first_BxL, second_BxL, train):
    batch, _, h = hidden_BxLxH.shape
    # Initial state: softmax(w . x_l) summary of the (dropped-out) first segment; the
    # reference's nn.Linear(H, 1), kept as a vector and a bias to fold the mask in.
    w_H = self.param('query_kernel', head_init, (h,))
    b = self.param('query_bias', nn.initializers.zeros, ())
    m_BxH = sequence_dropout_mask(self.dropout, batch, h, train, self.dtype)
    scores_BxL = jnp.einsum('blh,bh->bl', hidden_BxLxH, m_BxH * w_H.astype(self.dtype))
    alpha_BxL = masked_softmax(scores_BxL + b.astype(self.dtype), first_BxL)
    s_BxH = m_BxH * jnp.einsum('bl,blh->bh', alpha_BxL.astype(self.dtype), hidden_BxLxH)

    # The turns share their weights: a scan compiles one turn, not `turns` copies.
    turns = nn.scan(
      SanTurn,
      variable_broadcast='params',
      split_rngs={'params': False, 'dropout': True},
      in_axes=(nn.broadcast, nn.broadcast),
      length=self.turns,
    )
    _, logits_TxBxC = turns(self.classes, self.dropout, train, self.dtype, name='turn')(
      s_BxH, hidden_BxLxH, second_BxL
    )

    probs_BxTxC = jax.nn.softmax(logits_TxBxC.transpose(1, 0, 2), axis=-1)
    if train and self.mem_drop > 0:
      # Stochastic prediction dropout: drop whole turns, but always keep one random turn.
      keep_rng, turn_rng = jax.random.split(self.make_rng('dropout'))
      keep_BxT = jax.random.bernoulli(keep_rng, 1 - self.mem_drop, (batch, self.turns))
      forced = jax.random.randint(turn_rng, (batch,), 0, self.turns)
      keep_BxT = keep_BxT | jax.nn.one_hot(forced, self.turns, dtype=jnp.bool_)
      probs_BxTxC = probs_BxTxC * (keep_BxT / (1 - self.mem_drop))[..., None]
    return jnp.log(probs_BxTxC.mean(axis=1))


class PooledHead(nn.Module):
  """Dropout then a dense layer on BERT's pooled [CLS] vector."""

  classes: int
  dropout: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, pooled_BxH, train):
    x = nn.Dropout(self.dropout, deterministic=not train)(pooled_BxH)
    return nn.Dense(self.classes, kernel_init=head_init, dtype=self.dtype, name='dense')(x).astype(
      jnp.float32
    )


class MtDnn(nn.Module):
  """BERT encoder and pooler shared by all tasks; one head per task in TASKS."""

  cfg: Any
  dtype: Any = jnp.float32

  def setup(self):
    self.bert = bert.BertEncoder(self.cfg, self.dtype)
    self.pooler = bert.Pooler(self.dtype)
    heads = {}
    for task in TASKS:
      if task.head == 'san':
        heads[task.name] = SanClassifier(
          task.classes, task.dropout, self.cfg['turns'], self.cfg['mem_drop'], self.dtype
        )
      else:
        heads[task.name] = PooledHead(task.classes, task.dropout, self.dtype)
    self.heads = heads

  def encode(self, tokens_BxL, segments_BxL, train):
    hidden_BxLxH, _ = self.bert(tokens_BxL, segments_BxL, train)
    return hidden_BxLxH, self.pooler(hidden_BxLxH)

  def head(self, index, hidden_BxLxH, pooled_BxH, tokens_BxL, segments_BxL, train):
    """Task `index`'s (static) outputs: float32 logits, log-probabilities or scores (B,)."""
    task = TASKS[index]
    if task.head == 'san':
      valid = tokens_BxL != bert.PAD
      first, second = valid & (segments_BxL == 0), valid & (segments_BxL == 1)
      return self.heads[task.name](hidden_BxLxH, first, second, train)
    out = self.heads[task.name](pooled_BxH, train)
    return out[:, 0] if task.head == 'regression' else out

  def __call__(self, batch, train):
    """Every head on one task batch (tokens, segments): initializes all parameters at once."""
    hidden, pooled = self.encode(batch['tokens'], batch['segments'], train)
    return {
      task.name: self.head(i, hidden, pooled, batch['tokens'], batch['segments'], train)
      for i, task in enumerate(TASKS)
    }


def make_batch(cfg, rng, n):
  """One batch of `n` full-length sequences per task: {task name: batch}.

  Pair tasks split at a random point (both segments non-empty); labels are class ids, or a
  similarity score in [0, 5] for STS-B. The original padded each batch to its longest example;
  full length is the worst case the max-batch search must fit.
  """
  length = cfg['seq_len']
  batches = {}
  for task, task_rng in zip(TASKS, jax.random.split(rng, len(TASKS))):
    tok_rng, split_rng, label_rng = jax.random.split(task_rng, 3)
    tokens = jax.random.randint(tok_rng, (n, length), 1, cfg['vocab'], jnp.int32)
    if task.pair:
      split = jax.random.randint(split_rng, (n, 1), length // 4, 3 * length // 4 + 1)
      segments = (jnp.arange(length)[None] >= split).astype(jnp.int32)
    else:
      segments = jnp.zeros((n, length), jnp.int32)
    if task.head == 'regression':
      labels = jax.random.uniform(label_rng, (n,), jnp.float32, 0.0, 5.0)
    else:
      labels = jax.random.randint(label_rng, (n,), 0, task.classes, jnp.int32)
    batches[task.name] = {'tokens': tokens, 'segments': segments, 'labels': labels}
  return batches


def task_loss(index, outputs, labels):
  """MT-DNN's per-task loss: MSE for STS-B, else cross-entropy (over SAN's log-probabilities)."""
  if TASKS[index].head == 'regression':
    return jnp.mean((outputs - labels.astype(jnp.float32)) ** 2)
  return bert.cross_entropy(outputs, labels.astype(jnp.int32)).mean()


class AdamaxState(NamedTuple):
  mu: Any
  nu: Any


def scale_by_mtdnn_adamax(b1=0.9, b2=0.999, eps=1e-6):
  """MT-DNN's Adamax (module/bert_optim.py): no bias correction, u = max(b2 u, |g| + eps)."""

  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return AdamaxState(mu=zeros(), nu=zeros())

  def update(grads, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
    nu = jax.tree.map(lambda u, g: jnp.maximum(b2 * u, jnp.abs(g) + eps), state.nu, grads)
    return jax.tree.map(lambda m, u: m / (u + eps), mu, nu), AdamaxState(mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def optimizer(cfg):
  """Global norm clip 1, Adamax, decoupled weight decay 0.01, linear warm-up then decay.

  Every parameter decays: MT-DNN's param groups set 'weight_decay', which its Adamax never
  reads; it applies its default weight_decay_rate 0.01 to biases and LayerNorms too.
  """
  total = cfg['total_steps']
  warmup = max(int(cfg['warmup'] * total), 1)
  # pytorch-pretrained-bert 0.6's warmup_linear: up to lr over `warmup`, then down to 0 at total.
  schedule = optax.join_schedules(
    [
      optax.linear_schedule(0.0, cfg['lr'], warmup),
      optax.linear_schedule(cfg['lr'], 0.0, max(total - warmup, 1)),
    ],
    [warmup],
  )
  return optax.chain(
    optax.clip_by_global_norm(cfg['clip']),
    scale_by_mtdnn_adamax(),
    optax.add_decayed_weights(0.01),
    optax.scale_by_learning_rate(schedule),
  )


def trainer(cfg, policy):
  """One `step` is one cycle through TASKS: an optimizer update per task, in order.

  The cycle is a scan over the tasks with the heads behind a lax.switch, so BERT-large's
  forward and backward are compiled once, not once per task.
  """
  module = MtDnn(cfg, policy.compute_dtype)
  tx = optimizer(cfg)

  def init(rng):
    params_rng, dropout_rng, batch_rng = jax.random.split(rng, 3)
    batch = make_batch(cfg, batch_rng, 1)[TASKS[0].name]  # a pair task: every head can run
    variables = module.init({'params': params_rng, 'dropout': dropout_rng}, batch, train=False)
    params = variables['params']
    return wl.TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      model_state={},
      opt_state=tx.init(params),
      loss_scale=policy.initial_scale(),
    )

  def loss_fn(params, index, tokens, segments, labels, rng):
    encoder_rng, head_rng = jax.random.split(rng)
    variables = {'params': params}
    hidden, pooled = module.apply(
      variables, tokens, segments, True, method=MtDnn.encode, rngs={'dropout': encoder_rng}
    )

    def branch(i):
      def head_loss(hidden, pooled):
        outputs = module.apply(
          variables,
          i,
          hidden,
          pooled,
          tokens,
          segments,
          True,
          method=MtDnn.head,
          rngs={'dropout': head_rng},
        )
        return task_loss(i, outputs, labels)

      return head_loss

    return jax.lax.switch(index, [branch(i) for i in range(len(TASKS))], hidden, pooled)

  def step(state, batch, rng):
    rng = jax.random.fold_in(rng, state.step)

    def update(carry, xs):
      params, opt_state, loss_scale = carry
      index = xs[0]
      fn = lambda p: loss_fn(p, *xs, jax.random.fold_in(rng, index))
      if loss_scale is None:
        value, grads = jax.value_and_grad(fn)(params)
        finite = None
      else:
        loss_scale, finite, value, grads = loss_scale.value_and_grad(fn)(params)
      updates, new_opt_state = tx.update(grads, opt_state, params)
      new_params = optax.apply_updates(params, updates)
      if finite is not None:
        # An update whose scaled gradients overflowed changes nothing but the scale.
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        new_params, new_opt_state = keep(new_params, params), keep(new_opt_state, opt_state)
      return (new_params, new_opt_state, loss_scale), value

    stack = lambda key, dtype: jnp.stack([batch[t.name][key].astype(dtype) for t in TASKS])
    # Class ids are exact in float32; the classification losses cast them back.
    xs = (
      jnp.arange(len(TASKS)),
      stack('tokens', jnp.int32),
      stack('segments', jnp.int32),
      stack('labels', jnp.float32),
    )
    (params, opt_state, loss_scale), losses = jax.lax.scan(
      update, (state.params, state.opt_state, state.loss_scale), xs
    )
    new_state = wl.TrainState(
      step=state.step + 1,
      params=params,
      model_state=state.model_state,
      opt_state=opt_state,
      loss_scale=loss_scale,
    )
    metrics = {'loss': losses.mean(), **{f'{t.name}_loss': losses[i] for i, t in enumerate(TASKS)}}
    return new_state, metrics

  def param_groups(state):
    params = state.params
    heads = {k: v for k, v in params.items() if k not in ('bert', 'pooler')}
    return {'encoder': {'bert': params['bert'], 'pooler': params['pooler']}, 'heads': heads}

  return wl.Trainer(
    init=init,
    make_batch=lambda rng, n: make_batch(cfg, rng, n),
    step=step,
    param_groups=param_groups,
  )


def flops_per_example(cfg):
  """Training FLOPs of one example slot of a cycle: one sequence through every task."""
  h, length, turns = cfg['hidden'], cfg['seq_len'], cfg['turns']
  encoder = length * bert.encoder_flops_per_token(cfg, length) + 2 * h * h  # + pooler
  forward = 0
  for task in TASKS:
    if task.head == 'san':
      # Query self-attention, then per turn: bilinear map, scores, summary, classifier, GRU.
      head = 4 * length * h + turns * (
        2 * h * h + 4 * length * h + 8 * h * task.classes + 12 * h * h
      )
    else:
      head = 2 * h * task.classes
    forward += encoder + head
  return 3.0 * forward


# GLUE train sets at batch 32 for 5 epochs (train.py's default; README: batch 32):
# ceil(392702/32) + ceil(2490/32) + ... = 29663 batches an epoch.
MT_DNN_CONFIG = dict(
  vocab=30522,
  hidden=1024,
  layers=24,
  heads=16,
  ffn=4096,
  max_positions=512,
  type_vocab=2,
  dropout=0.1,
  seq_len=512,
  turns=5,
  mem_drop=0.1,
  lr=5e-5,
  warmup=0.1,
  total_steps=5 * 29663,
  clip=1.0,
)
MT_DNN_TINY = dict(
  vocab=128,
  hidden=32,
  layers=2,
  heads=4,
  ffn=64,
  max_positions=32,
  seq_len=16,
  lr=1e-3,
  total_steps=400,
)

MT_DNN = wl.Workload(
  name='mt_dnn',
  description=(
    'MT-DNN on the 8 GLUE tasks: shared BERT-large, SAN answer heads; one step is '
    'one update per task'
  ),
  unit='sequences',
  throughput_unit='sequences/s',
  config=MT_DNN_CONFIG,
  tiny=MT_DNN_TINY,
  trainer=trainer,
  flops_per_example=flops_per_example,
  units_per_example=lambda cfg: len(TASKS),
)
