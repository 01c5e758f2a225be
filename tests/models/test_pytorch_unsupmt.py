"""The PyTorch peer of unsupmt trains what the JAX workload trains: the same parameter count and
batch, four updates an iteration on one schedule, XLM's noise, a cached greedy generation that
agrees with teacher forcing, and it learns on a fixed batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from models import precision, registry
from models import transformer as jax_transformer
from models import workload as wl
from models.pytorch import peer as peer_lib
from models.pytorch import registry as peer_registry
from models.pytorch import unsupmt
from models.unsupmt import noise
from models.unsupmt import xlm as jax_xlm
from tests import shapes

NAME = 'unsupmt'
CPU = torch.device('cpu')
CFG = registry.get(NAME).resolve(tiny=True)


pytestmark = pytest.mark.usefixtures('torch_one_thread')


def _batch(n, seed):
  return unsupmt.make_batch(CFG, n, torch.Generator().manual_seed(seed), CPU)


def test_full_size_parameter_count_equals_jax():
  w = registry.get(NAME)
  cfg = w.resolve()
  state = shapes.state(NAME, cfg)
  setup = peer_registry.get(NAME).build(cfg, torch.device('meta'))
  assert setup.param_count() == wl.count_params(state.params) == 308_834_955
  assert set(setup.modules) == {'encoder', 'decoder'}
  assert peer_registry.get(NAME).differences == ()


def test_batch_has_the_jax_shapes_dtypes_and_values():
  jax_batch = jax_xlm.make_batch(CFG, jax.random.key(0), 5)
  batch = _batch(5, 0)
  assert set(batch) == set(jax_batch)
  for key, value in batch.items():
    assert tuple(value.shape) == jax_batch[key].shape == (2, 5, CFG['seq_len'] + 2), key
    assert str(value.dtype).removeprefix('torch.') == str(jax_batch[key].dtype), key
    assert (value[..., 0] == noise.EOS).all() and (value[..., -1] == noise.EOS).all()
    words = value[..., 1:-1]
    assert noise.FIRST_WORD <= int(words.min()) and int(words.max()) < CFG['vocab']
  assert not torch.equal(batch['ae'], batch['bt'])  # a fresh batch for each sub-step


def _sentences(n=64, length=12):
  words = torch.randint(
    noise.FIRST_WORD, 100, (n, length), generator=torch.Generator().manual_seed(0)
  )
  eos = torch.full((n, 1), noise.EOS)
  return torch.cat([eos, words, eos], dim=1)


def test_word_shuffle_moves_words_less_than_k_places_and_keeps_the_eos():
  torch.manual_seed(0)
  x = _sentences()
  y = unsupmt.word_shuffle(x, 3.0)
  assert not torch.equal(x, y)
  assert (y[:, 0] == noise.EOS).all() and (y[:, -1] == noise.EOS).all()
  for row_x, row_y in zip(x.tolist(), y.tolist()):
    assert sorted(row_x) == sorted(row_y)
    # Words are distinct often enough to locate them; check those.
    for j, word in enumerate(row_y[1:-1], start=1):
      if row_x.count(word) == 1:
        assert abs(row_x.index(word) - j) < 3


def test_word_dropout_keeps_a_subsequence_and_pads_the_end():
  torch.manual_seed(0)
  x = _sentences()
  y = unsupmt.word_dropout(x, 0.3)
  assert y.shape == x.shape
  dropped = 0
  for row_x, row_y in zip(x.tolist(), y.tolist()):
    kept = [t for t in row_y if t != noise.PAD]
    assert row_y == kept + [noise.PAD] * (len(row_y) - len(kept))
    it = iter(row_x)
    assert all(t in it for t in kept)  # a subsequence, both EOS included
    assert kept[0] == kept[-1] == noise.EOS and len(kept) >= 3
    dropped += len(row_x) - len(kept)
  assert 0.2 < dropped / (x.shape[0] * (x.shape[1] - 2)) < 0.4
  # A sentence that loses every word keeps one of them.
  alone = unsupmt.word_dropout(x, 1.0)
  assert ((alone != noise.PAD).sum(dim=1) == 3).all()


def test_word_blank_masks_only_words():
  torch.manual_seed(0)
  x = _sentences()
  y = unsupmt.word_blank(x, 0.5)
  changed = y != x
  assert (y[changed] == noise.MASK).all()
  assert not changed[:, 0].any() and not changed[:, -1].any()
  assert 0.4 < changed.float().mean() * x.shape[1] / (x.shape[1] - 2) < 0.6


def _with_eos_bias(model, bias):
  with torch.no_grad():
    model.decoder.pred_bias[noise.EOS] = bias


def test_generation_stops_at_its_length_and_matches_teacher_forcing():
  torch.manual_seed(0)
  model = unsupmt.EncoderDecoder(CFG)
  src, length = _batch(3, 1)['bt'][0], jax_xlm.max_len(CFG)
  # EOS never chosen: every row runs to max_len and is closed there.
  _with_eos_bias(model, -1e4)
  never = unsupmt.generate(model, src, unsupmt.EN, unsupmt.FR, length)
  assert never.shape == (3, length) and never.dtype == src.dtype
  assert (never[:, 0] == noise.EOS).all() and (never[:, -1] == noise.EOS).all()
  assert (never[:, 1:-1] != noise.EOS).all()
  # The cached steps agree with one teacher-forced pass over the generated prefix.
  with torch.no_grad():
    logits = model(src, unsupmt.EN, never[:, :-1], unsupmt.FR, train=False)
  np.testing.assert_array_equal(logits.argmax(-1)[:, :-1].numpy(), never[:, 1:-1].numpy())
  # EOS always chosen: each sentence ends at once and the rest is padding.
  _with_eos_bias(model, 1e4)
  at_once = unsupmt.generate(model, src, unsupmt.EN, unsupmt.FR, length)
  assert (at_once[:, :2] == noise.EOS).all() and (at_once[:, 2:] == noise.PAD).all()


def test_cross_entropy_equals_jax():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 11)).astype(np.float32)
  targets = rng.integers(0, 11, size=(2, 5)).astype(np.int32)
  targets[0, 1] = noise.PAD
  want = jax_xlm.cross_entropy(jnp.asarray(logits), jnp.asarray(targets))
  got = unsupmt.cross_entropy(torch.from_numpy(logits), torch.from_numpy(targets))
  assert (targets == noise.PAD).any()  # padding targets do not count
  np.testing.assert_allclose(got.item(), float(want), rtol=1e-6)


def test_four_updates_an_iteration_follow_the_jax_schedule():
  cfg = dict(CFG, warmup=6)
  setup = unsupmt.build(cfg, CPU)
  assert [u.clip_norm for u in setup.updates] == [cfg['clip_norm']] * 4
  optimizer = setup.updates[0].optimizer
  assert all(u.optimizer is optimizer for u in setup.updates)  # one Adam, as one optax chain
  want = jax_transformer.inverse_sqrt(cfg['lr'], cfg['warmup'])
  batch = _batch(2, 0)
  for step in range(3):
    np.testing.assert_allclose(optimizer.param_groups[0]['lr'], float(want(jnp.int32(4 * step))))
    peer_lib.run_updates(setup, batch, step)


def test_one_iteration_then_every_loss_falls_on_a_fixed_batch():
  torch.manual_seed(0)
  setup = peer_registry.get(NAME).build(CFG, CPU)
  losses = []
  for update in setup.updates:
    loss = update.loss
    update.loss = lambda b, s, loss=loss: losses.append(loss(b, s)) or losses[-1]
  batch = _batch(8, 1)
  for step in range(15):
    peer_lib.run_updates(setup, batch, step)
  per_update = np.array([x.item() for x in losses]).reshape(15, 4)
  assert np.isfinite(per_update).all()
  # Each of the four (ae en, ae fr, bt en-fr-en, bt fr-en-fr) learns.
  assert (per_update[-3:].mean(0) < 0.8 * per_update[:3].mean(0)).all(), per_update


def _torch_state_from_jax(params):
  """The JAX workload's parameters under the peer's names (Dense kernels transposed)."""
  state = {}
  for path, value in jax.tree_util.tree_flatten_with_path(params)[0]:
    keys = [k.key for k in path]
    leaf = keys.pop()
    keys = [
      k.replace('layer_', 'layers.') if k.startswith('layer_') and k[6:].isdigit() else k
      for k in keys
    ]
    keys = [k for k in keys if k != 'ffn']
    value = np.asarray(value)
    if leaf == 'kernel':
      leaf, value = 'weight', value.T
    elif leaf in ('scale', 'embedding'):
      leaf = 'weight'
    state['.'.join(keys + [leaf])] = torch.from_numpy(value.copy())
  return state


def test_logits_equal_the_jax_models_with_its_weights():
  parts = jax_xlm.build(CFG, precision.get('fp32'))
  params = jax.jit(parts.init)(jax.random.key(0)).params
  model = unsupmt.EncoderDecoder(CFG)
  model.load_state_dict(_torch_state_from_jax(params), strict=True)
  batch = _batch(3, 2)
  src = unsupmt.word_dropout(batch['ae'][0], 0.3)  # source padding, masked in both
  assert (src == noise.PAD).any()
  tgt = batch['ae'][1]
  with torch.no_grad():
    got = model(src, unsupmt.EN, tgt[:, :-1], unsupmt.FR, train=False)
  want = parts.module.apply(
    {'params': params},
    jnp.asarray(src.numpy()),
    jax_xlm.EN,
    jnp.asarray(tgt[:, :-1].numpy()),
    jax_xlm.FR,
    False,
  )
  np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=1e-5, atol=1e-5)
