"""Text for --data=tfds: each original's preprocessing of TFDS records to one example at the
workload's static shapes (NumPy, on the host): WMT for the translation workloads, SQuAD, GLUE,
Wikipedia for BERT's pre-training, WMT's two sides as XLM's monolingual streams.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

import numpy as np

from models.unsupmt import noise as xlm_ids

Example = dict[str, np.ndarray]


# Text: the originals' tokenizers (BERT's WordPiece vocabulary, fairseq's and XLM's BPE codes)
# are files that are not at hand offline; a word's id is its CRC32 hashed into the vocabulary
# above the reserved ids, the same on every machine.

PAD, CLS, EOS, SEP = 0, 1, 2, 3  # PAD and EOS are the models' own; CLS and SEP BERT's markers
MASK = EOS  # BERT's [MASK]: the id of EOS, which BERT's text never holds
FIRST_WORD = 4
_WORDS = re.compile(r'\w+|[^\w\s]')


def words(text: str) -> list[tuple[str, int, int]]:
  """The words and punctuation marks of `text`, lower-cased, with their character spans."""
  return [(m.group().lower(), m.start(), m.end()) for m in _WORDS.finditer(text)]


def word_id(word: str, vocab: int, first: int = FIRST_WORD) -> int:
  """A word's stand-in token id: its CRC32 in [first, vocab) (the ids below are reserved)."""
  return first + zlib.crc32(word.encode()) % (vocab - first)


def _text(value: Any) -> str:
  return value.decode() if isinstance(value, bytes) else str(value)


def sentence(text: str, vocab: int, length: int) -> np.ndarray:
  """A sentence's ids ending with EOS, cut to `length` and padded with PAD (fairseq's order)."""
  ids = [word_id(w, vocab) for w, _, _ in words(text)][: length - 1] + [EOS]
  return np.array(ids + [PAD] * (length - len(ids)), np.int32)


def translation(source: str, target: str, vocabs: tuple[str, str]):
  def example(record, cfg, rng) -> Example:
    del rng
    src = sentence(_text(record[source]), cfg[vocabs[0]], cfg['src_len'])
    tgt = sentence(_text(record[target]), cfg[vocabs[1]], cfg['tgt_len'])
    # The decoder's input is the target shifted right behind EOS, as fairseq's.
    return {'source': src, 'target': tgt, 'target_in': np.concatenate([[EOS], tgt[:-1]])}

  return example


def monolingual(language: str):
  """One side of a translation record as an XLM sentence on its own: EOS w1 .. wn EOS PAD ..,
  n cut to seq_len, in XLM's dictionary ids (its EOS, PAD and first word)."""

  def example(record, cfg, rng) -> Example:
    del rng
    length, vocab = cfg['seq_len'], cfg['vocab']
    ids = [word_id(w, vocab, xlm_ids.FIRST_WORD) for w, _, _ in words(_text(record[language]))]
    ids = [xlm_ids.EOS, *ids[:length], xlm_ids.EOS]
    return {'sentence': np.array(ids + [xlm_ids.PAD] * (length + 2 - len(ids)), np.int32)}

  return example


def xlm_batch(streams: dict[str, Example]) -> Example:
  """2n English and 2n French sentences to XLM's batch: the first n of each language for the
  auto-encoder steps, the next n for back-translation, each stacked [en, fr]."""
  en, fr = streams['en']['sentence'], streams['fr']['sentence']
  n = len(en) // 2
  return {'ae': np.stack([en[:n], fr[:n]]), 'bt': np.stack([en[n:], fr[n:]])}


def squad(record, cfg, rng) -> Example:
  """[CLS] question [SEP] context window [SEP] with the answer's first and last token, as
  run_squad.py builds a training feature: the question cut to question_len - 2 tokens, the
  context in windows of half the room left, the first window holding the whole answer taken
  (none: the answer points at [CLS], as run_squad.py's windows without it)."""
  del rng
  length, vocab = cfg['seq_len'], cfg['vocab']
  question = [word_id(w, vocab) for w, _, _ in words(_text(record['question']))]
  question = question[: cfg['question_len'] - 2]
  context = words(_text(record['context']))
  answers = record['answers']
  start_char = int(np.asarray(answers['answer_start']).reshape(-1)[0])
  answer = _text(np.asarray(answers['text']).reshape(-1)[0])
  end_char = start_char + max(len(answer), 1)
  inside = [i for i, (_, b, e) in enumerate(context) if b < end_char and e > start_char]
  room = length - len(question) - 3
  first = len(question) + 2  # the context's first position
  start = end = 0
  offset = 0
  if inside:
    stride = max(room // 2, 1)
    offset = next(
      (o for o in range(0, len(context), stride) if o <= inside[0] and inside[-1] < o + room),
      0,
    )
    if offset <= inside[0] and inside[-1] < offset + room:
      start, end = first + inside[0] - offset, first + inside[-1] - offset
  window = [word_id(w, vocab) for w, _, _ in context[offset : offset + room]]
  ids = [CLS, *question, SEP, *window, SEP]
  tokens = np.array(ids + [PAD] * (length - len(ids)), np.int32)
  segments = np.zeros(length, np.int32)
  segments[first : len(ids)] = 1
  return {
    'tokens': tokens,
    'segments': segments,
    'start_positions': np.int32(start),
    'end_positions': np.int32(end),
  }


def pair(first: str, second: str | None, vocab: int, length: int) -> tuple[np.ndarray, ...]:
  """[CLS] a [SEP] (b [SEP]) as BERT's classifiers read them: the longer sentence cut a word at a
  time until both fit (truncate_seq_pair), segment 1 for b, padded with PAD."""
  a = [word_id(w, vocab) for w, _, _ in words(first)]
  b = [word_id(w, vocab) for w, _, _ in words(second)] if second is not None else []
  room = length - (3 if second is not None else 2)
  while len(a) + len(b) > room:
    (a if len(a) >= len(b) else b).pop()
  ids = [CLS, *a, SEP] + ([*b, SEP] if second is not None else [])
  tokens = np.array(ids + [PAD] * (length - len(ids)), np.int32)
  segments = np.zeros(length, np.int32)
  segments[len(a) + 2 : len(ids)] = 1
  return tokens, segments


def glue(fields: tuple[str, ...], regression: bool = False):
  def example(record, cfg, rng) -> Example:
    del rng
    texts = [_text(record[f]) for f in fields]
    tokens, segments = pair(
      texts[0], texts[1] if len(texts) > 1 else None, cfg['vocab'], cfg['seq_len']
    )
    label = np.float32(record['label']) if regression else np.int32(record['label'])
    return {'tokens': tokens, 'segments': segments, 'labels': label}

  return example


_SENTENCE_END = re.compile(r'(?<=[.!?])\s+|\n+')


def sentences(text: str) -> list[str]:
  """The sentences of `text`: its lines, split after each full stop, question or exclamation
  mark that a space follows; empty ones dropped."""
  return [s for s in (s.strip() for s in _SENTENCE_END.split(text)) if s]


def bert_pretraining(records, cfg, rng) -> Example:
  """create_pretraining_data.py's example for one sentence pair: a random sentence of the
  article, then 50% its next sentence (label 0) and 50% a random sentence of another article
  (label 1; always where the article has no next); [CLS] a [SEP] b [SEP] cut to seq_len as
  `pair` does; 15% of the tokens (at least one, at most `masked`, never [CLS] or [SEP]) chosen
  for prediction, in position order: 80% replaced by [MASK], 10% by a random word, 10% kept."""
  record, other = records
  vocab, length, masked = cfg['vocab'], cfg['seq_len'], cfg['masked']
  own = sentences(_text(record['text']))
  i = int(rng.integers(len(own))) if own else 0
  first = own[i] if own else ''
  if i + 1 < len(own) and rng.random() < 0.5:
    second, label = own[i + 1], 0
  else:
    theirs = sentences(_text(other['text']))
    second, label = (theirs[int(rng.integers(len(theirs)))] if theirs else ''), 1
  tokens, segments = pair(first, second, vocab, length)
  candidates = np.flatnonzero(tokens >= FIRST_WORD)
  used = int(np.count_nonzero(tokens))
  k = min(masked, max(1, round(used * 0.15)), len(candidates))
  chosen = np.sort(rng.permutation(candidates)[:k])
  originals = tokens[chosen].copy()
  draw = rng.random(k)
  tokens[chosen] = np.where(
    draw < 0.8, MASK, np.where(draw < 0.9, tokens[chosen], rng.integers(FIRST_WORD, vocab, k))
  )
  positions, ids, weights = (np.zeros(masked, t) for t in (np.int32, np.int32, np.float32))
  positions[:k], ids[:k], weights[:k] = chosen, originals, 1.0
  return {
    'tokens': tokens,
    'segments': segments,
    'masked_positions': positions,
    'masked_ids': ids,
    'masked_weights': weights,
    'next_sentence': np.int32(label),
  }
