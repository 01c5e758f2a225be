"""A benchmark of the BERT family's attention: each form of `attention_probs` (XLA's kernels with
the probabilities saved or recomputed, the fused kernels of models/layers/fused_attention.py at
their default tiling and at others; at the default tiling with each of their two dropout draws,
'fused, bernoulli', a hash per decision, and 'fused, grouped', four decisions a hash), forward and
backward with dropout, timed in turn in one process.

    python -m jaxbench.attention_benchmark        # bert_base, bert_squad, mt_dnn; tf32 and bf16
    python -m jaxbench.attention_benchmark --models=bert_squad --precisions=bf16 \\
        --blocks=64,64,64,4,4,2 --blocks=128,64,64,8,4,3
    python -m jaxbench.attention_benchmark --tiny   # a quick check on a CPU (Pallas' interpreter)

--models defaults to every workload built on BERT's encoder. Each workload's self-attention at its
comparison batch (--reference_batch) and its own heads, width, sequence length and dropout: queries,
keys and values [B, L, H, D] as its projections give them, every position attended, one dropout
decision per probability. What is timed is one call of the jitted gradient of sum(attention *
cotangent) with respect to the queries, keys and values: the layer's forward and backward passes,
without the projections around them. A row gives the median of --windows windows of calls after
--warmup_steps untimed ones, their spread, the compile, the speed relative to the saved form in the
same process (a ratio, which a shared machine measures better than an absolute time), and how far
its gradients are from those of the same dropout decisions in XLA's kernels (the saved form's, or
for four decisions a hash fused_attention.reference_attention's), which differ by rounding only: a
fast tiling that computes something else shows here. A tiling's blocks are cut to the sequence where
longer. A benchmark, not a test: a slow form fails nothing; a tiling the GPU cannot hold gets a row
that says why.
"""

import functools
import statistics
import time

from absl import app, flags

from flags import attention_benchmark as bench_flags
from flags import benchmarks as shared_flags
from flags import run as run_flags
from flags import sweep as sweep_flags
from jaxbench import cli

flags.adopt_module_key_flags(bench_flags)
for _name in ('models', 'tiny', 'warmup_steps', 'steps', 'windows', 'precisions'):
  flags.declare_key_flag(_name)

_fail = functools.partial(cli.fail, 'jaxbench.attention_benchmark')
HEADER = (
  'workload',
  'precision',
  'B x L x H x D',
  'form',
  'tiling',
  'ms',
  'spread',
  'compile s',
  'differs by',
)
DEFAULT_PRECISIONS = ('tf32', 'bf16')
TINY_BATCH = 2  # sequences, with --tiny


def encoder_models() -> list[str]:
  """The workloads built on BERT's encoder, whose attention `attention_probs` chooses."""
  from models import registry  # pylint: disable=g-import-not-at-top

  keys = ('attention_probs', 'hidden', 'heads', 'seq_len', 'dropout')
  return [n for n in registry.names() if all(k in registry.get(n).config for k in keys)]


def shape(name: str, tiny: bool) -> tuple[int, int, int, int, float]:
  """(B, L, H, D, dropout) of the workload's self-attention at its comparison batch."""
  from jaxbench.pytorch import frameworks  # pylint: disable=g-import-not-at-top
  from models import registry  # pylint: disable=g-import-not-at-top

  w = registry.get(name)
  cfg = w.resolve(tiny=tiny)
  batch = TINY_BATCH if tiny else frameworks.REFERENCE_BATCH[name] // w.example_size(cfg)
  heads = cfg['heads']
  return batch, cfg['seq_len'], heads, cfg['hidden'] // heads, cfg['dropout']


# The fused kernels with each dropout draw (decisions per threefry hash); 'fused': the default's.
DRAWS = {'fused, bernoulli': 1, 'fused, grouped': 4}
REFERENCE = 'reference'  # fused_attention.reference_attention: not timed, the fused rows' check


def forms(tilings: list[dict]) -> list[tuple[str, dict | None]]:
  """(form, tiling) in the order timed: saved first, the baseline of each ratio."""
  fused = [(form, None) for form in DRAWS] + [('fused', t) for t in tilings]
  return [('saved', None), ('recomputed', None)] + fused


def per_hash(form: str) -> int | None:
  """The dropout decisions per hash of a fused form; None for XLA's forms."""
  from models.layers import fused_attention  # pylint: disable=g-import-not-at-top

  if form == 'fused':
    return fused_attention.DECISIONS_PER_HASH
  return DRAWS.get(form)


def gradient(form: str, tiling: dict | None, dims: tuple, dtype, matmul_precision: str):
  """The compiled gradient of sum(attention(q, k, v) * cotangent), its inputs, and its compile's
  seconds."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from models.layers import attention, fused_attention  # pylint: disable=g-import-not-at-top

  batch, length, heads, d, rate = dims
  if form == REFERENCE:

    def attend(q, k, v, broadcast_dropout, **kwargs):  # a decision per sequence and head
      del broadcast_dropout
      return fused_attention.reference_attention(q, k, v, **kwargs, decisions_per_hash=4)

  elif form in DRAWS:
    attend = functools.partial(
      fused_attention.dot_product_attention, decisions_per_hash=DRAWS[form]
    )
  else:
    attend = attention.attention_fn(form)
  if tiling is not None:
    attend = functools.partial(attend, blocks=tiling)
  valid = jnp.ones((batch, length), bool)  # as BertEncoder's mask: no padding in the batch
  mask = nn.make_attention_mask(valid, valid)

  def loss(q, k, v, cotangent, rng):
    out = attend(q, k, v, mask=mask, broadcast_dropout=False, dropout_rng=rng, dropout_rate=rate)
    return jnp.sum(out.astype(jnp.float32) * cotangent)

  keys = jax.random.split(jax.random.key(0), 5)
  size = (batch, length, heads, d)
  args = [jax.random.normal(k, size, jnp.float32).astype(dtype) for k in keys[:3]]
  args += [jax.random.normal(keys[3], size, jnp.float32), keys[4]]
  with jax.default_matmul_precision(matmul_precision):
    start = time.perf_counter()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
    compile_s = time.perf_counter() - start
  return compiled, args, compile_s


def timed(compiled, args, warmup: int, steps: int, windows: int) -> tuple[list[float], tuple]:
  """Seconds per call in each window (timing.windows: a window ends on block_until_ready of its
  last call), and the gradients of the first call."""
  import jax  # pylint: disable=g-import-not-at-top

  from jaxbench.core import timing  # pylint: disable=g-import-not-at-top

  first = jax.block_until_ready(compiled(*args))
  per_window = max(1, steps // windows)
  times, _, _ = timing.windows(
    lambda: compiled(*args), jax.block_until_ready, warmup, per_window, windows
  )
  return times, first


def difference(grads, reference) -> float:
  """The largest difference of any of the gradients from the reference's, relative to the
  reference's largest magnitude: with the same dropout decisions they differ by rounding."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  worst = 0.0
  for g, r in zip(grads, reference):
    g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
    worst = max(worst, float(np.max(np.abs(g - r)) / max(np.max(np.abs(r)), 1e-30)))
  return worst


def _tiling_text(form: str, tiling: dict | None, dims: tuple, policy) -> str:
  if per_hash(form) is None:
    return ''
  from models.layers import fused_attention  # pylint: disable=g-import-not-at-top

  tf32 = policy.matmul_precision != 'float32'
  shown = tiling or fused_attention.default_blocks(policy.compute_dtype, dims[1], tf32)
  text = ','.join(str(shown[f]) for f in bench_flags.FIELDS)
  return text if tiling else f'{text} (default)'


def rows(names, precisions, tilings, tiny, warmup, steps, windows) -> list[tuple]:
  """Each workload, precision and form, timed in turn, as table rows."""
  from models import precision  # pylint: disable=g-import-not-at-top

  out = []
  for name in names:
    dims = shape(name, tiny)
    for precision_name in precisions:
      policy = precision.get(precision_name)
      baseline = reference = grouped = None
      for form, tiling in forms(tilings):
        head = (name, precision_name, ' x '.join(map(str, dims[:4])), form)
        head += (_tiling_text(form, tiling, dims, policy),)
        try:
          compiled, args, compile_s = gradient(
            form, tiling, dims, policy.compute_dtype, policy.matmul_precision
          )
          times, grads = timed(compiled, args, warmup, steps, windows)
        except Exception as e:  # pylint: disable=broad-except
          first = (str(e).strip().splitlines() or [''])[0][:120]
          out.append(head + (f'failed: {type(e).__name__}: {first}',))
          continue
        median = statistics.median(times)
        if baseline is None:
          baseline, reference = median, grads
        if per_hash(form) == 4 and grouped is None:  # the same decisions in XLA's kernels
          check = gradient(REFERENCE, None, dims, policy.compute_dtype, policy.matmul_precision)
          grouped = check[0](*args)
        spread = 100.0 * (max(times) - min(times)) / median
        ms = f'{median * 1e3:.3f}' + ('' if form == 'saved' else f' ({baseline / median:.2f}x)')
        same_bits = grouped if per_hash(form) == 4 else reference
        differs = '' if form == 'saved' else f'{difference(grads, same_bits):.1e}'
        out.append(head + (ms, f'{spread:.1f}%', f'{compile_s:.1f}', differs))
  return out


def main(argv: list[str]) -> int:
  del argv  # cli.flags_parser refuses arguments that are not flags
  valid = encoder_models()
  names = shared_flags.MODELS.value or valid
  unknown = [n for n in names if n not in valid]
  if not names or unknown:
    _fail(f'--models: not a BERT encoder workload: {", ".join(unknown)}; valid: {", ".join(valid)}')
  precisions = sweep_flags.PRECISIONS.value or list(DEFAULT_PRECISIONS)
  tiny = run_flags.TINY.value
  if tiny is None:  # as a run: the tiny preset on a host without a GPU
    import jax  # pylint: disable=g-import-not-at-top

    tiny = jax.default_backend() != 'gpu'
  table = rows(
    names,
    precisions,
    bench_flags.blocks(),
    tiny,
    run_flags.WARMUP_STEPS.value,
    run_flags.STEPS.value,
    run_flags.WINDOWS.value,
  )
  cli.print_columns(HEADER, table, left=5)
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser('jaxbench.attention_benchmark'))
