"""XLM's denoising noise (Lample et al. 2018): word shuffle, word dropout, word blank.

Sentences are rows `EOS w1 .. wn EOS PAD ..` (XLM uses EOS as the start symbol).
Everything is static-shaped: a dropped word leaves the row one token shorter and a
PAD is pushed to the end, so a batch keeps its shape through the noise.
"""

import jax
import jax.numpy as jnp

# XLM's dictionary: <s>=0, </s>=1, <pad>=2, <unk>=3, <special0..9>=4..13, mask=<special1>.
EOS, PAD, MASK = 1, 2, 5
FIRST_WORD = 14


def _word_positions(tokens_BxL):
  """True on the words of each row: after the start EOS, before the closing EOS."""
  j = jnp.arange(tokens_BxL.shape[1])[None]
  length = (tokens_BxL != PAD).sum(axis=1, keepdims=True)
  return (j >= 1) & (j < length - 1)


def word_shuffle(tokens_BxL, rng, k):
  """Sort the words by position + U(0, k): no word moves by k places or more."""
  if k == 0:
    return tokens_BxL
  j = jnp.arange(tokens_BxL.shape[1], dtype=jnp.float32)[None]
  is_word = _word_positions(tokens_BxL)
  noise = jax.random.uniform(rng, tokens_BxL.shape, maxval=k)
  # The start symbol keeps score 0 (< every word); the closing EOS and the padding
  # get position + k, above every word's score, so they stay where they are.
  offset = jnp.where(is_word, noise, jnp.where(j == 0, 0.0, k))
  order = jnp.argsort(j + offset, axis=1, stable=True)
  return jnp.take_along_axis(tokens_BxL, order, axis=1)


def word_dropout(tokens_BxL, rng, p):
  """Drop each word with probability p (keeping at least one); pad at the end."""
  if p == 0:
    return tokens_BxL
  drop_rng, pick_rng = jax.random.split(rng)
  length = tokens_BxL.shape[1]
  j = jnp.arange(length)[None]
  is_word = _word_positions(tokens_BxL)
  drop = is_word & (jax.random.uniform(drop_rng, tokens_BxL.shape) < p)
  # As XLM: a sentence that lost every word gets one random word of it back.
  n_words = is_word.sum(axis=1)
  pick = jax.random.randint(pick_rng, n_words.shape, 1, jnp.maximum(n_words, 1) + 1)
  none_left = ((is_word & ~drop).sum(axis=1) == 0)[:, None]
  drop = drop & ~(none_left & (j == pick[:, None]))
  keep = (tokens_BxL != PAD) & ~drop
  # A stable sort that brings the kept tokens forward in their order.
  order = jnp.argsort(jnp.where(keep, j, j + length), axis=1, stable=True)
  moved = jnp.take_along_axis(tokens_BxL, order, axis=1)
  return jnp.where(j < keep.sum(axis=1, keepdims=True), moved, PAD)


def word_blank(tokens_BxL, rng, p):
  """Replace each word with the mask token with probability p."""
  if p == 0:
    return tokens_BxL
  blank = _word_positions(tokens_BxL) & (jax.random.uniform(rng, tokens_BxL.shape) < p)
  return jnp.where(blank, MASK, tokens_BxL)


def add_noise(tokens_BxL, rng, cfg):
  """XLM's add_noise: shuffle, then dropout, then blank."""
  shuffle_rng, dropout_rng, blank_rng = jax.random.split(rng, 3)
  x = word_shuffle(tokens_BxL, shuffle_rng, cfg['word_shuffle'])
  x = word_dropout(x, dropout_rng, cfg['word_dropout'])
  return word_blank(x, blank_rng, cfg['word_blank'])
