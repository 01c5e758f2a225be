"""MT-DNN (Liu et al. 2019): a shared BERT-large encoder with one head per GLUE task.

Pair-classification heads are the SAN answer module (Liu, Duh & Gao 2018, "Stochastic Answer
Networks for Natural Language Inference"); the structure and defaults follow namisan/mt-dnn as of
2019 (module/san.py, mt_dnn/matcher.py, train.py, data_utils/label_map.py).
"""

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from models import bert
from models import workload as wl
from models.mt_dnn.adamax import scale_by_mtdnn_adamax
from models.mt_dnn.san import SanClassifier, head_init


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
    return wl.TrainState.create(params, tx, policy)

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
  attention_probs='auto',  # models/layers/attention.PROBS
  projections='joined',  # models/layers/attention.PROJECTIONS
  dropout_draw='grouped',  # models/layers/dropout.DRAWS, of the encoder; the task heads' Bernoulli
  seq_len=512,
  turns=5,
  mem_drop=0.1,
  lr=5e-5,
  warmup=0.1,
  total_steps=5 * 29663,
  clip=1.0,
)
MT_DNN_TINY = dict(
  bert.TINY_ENCODER,
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
  # warmup: the fraction of total_steps.
  spec=dict(bert.ENCODER_SPEC, mem_drop=wl.FRACTION, warmup=wl.PROBABILITY),
  check=bert.check_encoder,
  trainer=trainer,
  flops_per_example=flops_per_example,
  units_per_example=lambda cfg: len(TASKS),
  revision=10,
)
