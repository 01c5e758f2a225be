"""The PyTorch peer of conv_seq2seq trains what the JAX workload trains: the same parameter count,
batch, convolution, forward pass and optimizer, and it learns on a fixed batch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from models import registry
from models import workload as wl
from models.conv_seq2seq import conv_tbc
from models.conv_seq2seq import fconv as jax_fconv
from models.pytorch import conv_seq2seq
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry
from tests import shapes

NAME = 'conv_seq2seq'
CPU = torch.device('cpu')


pytestmark = pytest.mark.usefixtures('torch_one_thread')


@pytest.mark.parametrize('tiny', [False, True])
def test_parameter_count_equals_jax(tiny):
  cfg = registry.get(NAME).resolve(tiny=tiny)
  setup = peer_registry.get(NAME).build(cfg, torch.device('meta'))
  assert setup.param_count() == wl.count_params(shapes.state(NAME, cfg).params)
  if not tiny:
    assert setup.param_count() == 216_005_176
  assert peer_registry.get(NAME).differences == ()


def test_batch_has_the_jax_shapes_dtypes_and_ranges():
  cfg = registry.get(NAME).resolve(tiny=True)
  jax_batch = jax_fconv.make_batch(cfg, jax.random.key(0), 5)
  batch = conv_seq2seq.make_batch(cfg, 5, torch.Generator().manual_seed(0), CPU)
  assert set(batch) == set(jax_batch)
  for key, value in batch.items():
    assert tuple(value.shape) == jax_batch[key].shape, key
    assert str(value.dtype).removeprefix('torch.') == str(jax_batch[key].dtype), key
  for key, vocab in (('source', 'src_vocab'), ('target', 'tgt_vocab')):
    assert 1 <= int(batch[key].min()) and int(batch[key].max()) < cfg[vocab]
  assert (batch['target_in'][:, 0] == 2).all()
  assert (batch['target_in'][:, 1:] == batch['target'][:, :-1]).all()


@pytest.mark.parametrize('causal', [False, True])
def test_convolution_equals_the_jax_temporal_conv(causal):
  torch.manual_seed(0)
  conv = conv_seq2seq.WeightNormConvTBC(4, 6, 3, causal, dropout=0.0)
  x = torch.randn(7, 2, 4)  # T x B x C
  with torch.no_grad():
    conv.g.mul_(torch.linspace(0.5, 2.0, 6))  # w != v
    conv.bias.normal_()
    w = conv.v * (conv.g / conv.v.norm(dim=(0, 1), keepdim=True))
    got = conv(x)
  want = conv_tbc.temporal_conv(
    jnp.asarray(x.numpy().transpose(1, 0, 2)), jnp.asarray(w.numpy()), causal
  ) + jnp.asarray(conv.bias.detach().numpy())
  np.testing.assert_allclose(got.numpy().transpose(1, 0, 2), np.asarray(want), atol=1e-5)


def _jax_variables(model, params):
  """The peer's weights under the JAX module's names (v, g, bias, embedding)."""
  t = lambda p: jnp.asarray(p.detach().numpy())
  dense = lambda m: {'v': t(m.v).T, 'g': t(m.g), 'bias': t(m.bias)}
  conv = lambda m: {'v': t(m.v), 'g': t(m.g), 'bias': t(m.bias)}
  embed = lambda m: {
    'tokens': {'embedding': t(m.tokens.weight)},
    'positions': {'embedding': t(m.positions.weight)},
  }

  def stack(s):
    out = {}
    for i, c in enumerate(s.convs):
      out[f'conv_{i}'] = conv(c)
      if not isinstance(s.projections[i], torch.nn.Identity):
        out[f'projection_{i}'] = dense(s.projections[i])
      if s.attentions:
        a = s.attentions[i]
        out[f'attention_{i}'] = {
          'in_projection': dense(a.in_projection),
          'out_projection': dense(a.out_projection),
        }
    return out

  mine = {
    'encoder_embed': embed(model.encoder_embed),
    'decoder_embed': embed(model.decoder_embed),
    'encoder': stack(model.encoder),
    'decoder': stack(model.decoder),
    **{n: dense(getattr(model, n)) for n in ('encoder_fc1', 'encoder_fc2')},
    **{n: dense(getattr(model, n)) for n in ('decoder_fc1', 'decoder_fc2', 'decoder_fc3')},
  }
  assert jax.tree.structure(mine) == jax.tree.structure(params)
  return mine


def test_forward_and_loss_equal_the_jax_model_on_the_same_weights():
  torch.manual_seed(0)
  cfg = registry.get(NAME).resolve(tiny=True)
  setup = conv_seq2seq.build(cfg, CPU)
  model = setup.modules['fconv'].eval()
  batch = conv_seq2seq.make_batch(cfg, 3, torch.Generator().manual_seed(2), CPU)
  batch['source'][0, -3:] = conv_seq2seq.PAD  # padded source steps are masked
  with torch.no_grad():
    for p in model.parameters():  # g != ||v||, nonzero biases: every weight matters
      p.add_(0.05 * torch.randn_like(p))
    logits = model(batch['source'], batch['target_in'])
    loss = setup.updates[0].loss(batch, 0)
  params = _jax_variables(model, shapes.state(NAME, cfg).params)
  jax_batch = {k: jnp.asarray(v.numpy()) for k, v in batch.items()}
  want = jax_fconv.FConv(cfg).apply({'params': params}, jax_batch, train=False)
  np.testing.assert_allclose(logits.numpy(), np.asarray(want), atol=1e-5)
  want_loss, _ = jax_fconv.loss(cfg, want, jax_batch)
  np.testing.assert_allclose(loss.item(), float(want_loss), rtol=1e-5)


def test_optimizer_step_equals_optax_nesterov_after_clipping():
  cfg = dict(registry.get(NAME).resolve(tiny=True), dropout=0.0)
  setup = conv_seq2seq.build(cfg, CPU)
  params = list(setup.modules['fconv'].parameters())
  start = [p.detach().clone() for p in params]
  tx = jax_fconv.optimizer(cfg)
  update = jax.jit(tx.update)
  state = tx.init([jnp.asarray(p.numpy()) for p in start])
  batch = conv_seq2seq.make_batch(cfg, 2, torch.Generator().manual_seed(0), CPU)
  want = [jnp.asarray(p.numpy()) for p in start]
  for step in range(2):
    before = [p.detach().clone() for p in params]
    setup.updates[0].optimizer.zero_grad()
    setup.updates[0].loss(batch, step).backward()
    grads = [jnp.asarray(p.grad.numpy()) for p in params]
    for p, b in zip(params, before):  # run_updates applies its own step from the same point
      p.grad = None
      p.data.copy_(b)
    peer_lib.run_updates(setup, batch, step)
    updates, state = update(grads, state, want)
    want = optax.apply_updates(want, updates)
    for p, w in zip(params, want):
      np.testing.assert_allclose(p.detach().numpy(), np.asarray(w), rtol=1e-4, atol=1e-6)


def test_one_iteration_then_the_loss_falls_on_a_fixed_batch():
  torch.manual_seed(0)
  cfg = registry.get(NAME).resolve(tiny=True)
  setup = peer_registry.get(NAME).build(cfg, CPU)
  assert set(setup.modules) == {'fconv'}
  batch = conv_seq2seq.make_batch(cfg, 8, torch.Generator().manual_seed(1), CPU)
  losses = [peer_lib.run_updates(setup, batch, step).item() for step in range(16)]
  assert np.isfinite(losses).all()
  # Dropout makes single steps noisy: the means of the first and last five, as the JAX test.
  assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses
