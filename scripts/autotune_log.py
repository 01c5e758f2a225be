"""Sum up XLA's autotuning log (jaxbench --autotune_log=FILE.txt): where a compile's time went.

The log is a text proto in one of two layouts. XLA's autotuner of 2025 on (jax 0.11.2 on the
H200) writes one `instruction_profiles` entry per autotuned instruction (a convolution, a
matmul, or a fusion whose emitters it compares), each with one `config_profiles` entry per
candidate it timed: the candidate's `config` (its `backend`: CUDNN, CUBLASLT, NATIVE_EMITTER,
BLOCK_LEVEL_EMITTER...), its `run_time` and `scratch_bytes`, and the instruction's `hlo_text`.
Older XLA writes `xla.AutotuningLogs`: `logs` entries with `results`. This prints how many
instructions and candidates there were, the GPU time the candidates' measured runs add up to,
per backend, and the instructions whose candidates took longest. It also prints, for each
instruction, the best candidate against the first one listed: with `--autotune_level=0` XLA
takes the first candidate it would have tried, so "first / best" is what turning autotuning off
would cost that instruction, as far as the order of the log is the autotuner's order (an
assumption, said in the output).

It also says, per instruction, its feature groups (a depthwise convolution has one per channel)
and the layer it came from (the op_name XLA keeps, forward or backward), and sums up the grouped
convolutions apart from the rest: session 15's deeplabv3 log put 983.5 of 1,034.3 ms of best
candidates there.

  python3 scripts/autotune_log.py FILE.txt[.gz] [--top N] [--sort time|best]
"""

import argparse
import gzip
import re
import sys

_TOKEN = re.compile(
  r'\s*(?:(?P<comment>#[^\n]*)|(?P<open>\{|<)|(?P<close>\}|>)|(?P<colon>:)'
  r'|(?P<string>"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')|(?P<name>\[[^\]]*\]|[^\s{}<>:"\']+))'
)


def _tokens(text: str):
  pos = 0
  while pos < len(text):
    m = _TOKEN.match(text, pos)
    if not m or m.end() == pos:
      if text[pos:].strip():
        raise ValueError(f'cannot read the text proto at offset {pos}: {text[pos : pos + 40]!r}')
      return
    pos = m.end()
    if m.lastgroup != 'comment':
      yield m.lastgroup, m.group(m.lastgroup)


def parse(text: str) -> dict:
  """A text proto as nested dicts: each field name maps to the list of its values (a message is
  a dict, a scalar the string written). Enough for reading logs; not a full text-format parser."""
  stack = [{}]
  name = None
  for kind, value in _tokens(text):
    if kind == 'name' and name is None:
      name = value
    elif kind == 'colon':
      continue
    elif kind == 'open':
      child = {}
      stack[-1].setdefault(name, []).append(child)
      stack.append(child)
      name = None
    elif kind == 'close':
      stack.pop()
      if not stack:
        raise ValueError('unbalanced braces in the text proto')
    elif name is not None:  # a scalar value
      stack[-1].setdefault(name, []).append(value.strip('"\''))
      name = None
    else:
      raise ValueError(f'a value without a field name: {value!r}')
  if len(stack) != 1:
    raise ValueError('unbalanced braces in the text proto')
  return stack[0]


def _first(msg: dict, key: str, default=None):
  values = msg.get(key)
  return values[0] if values else default


def seconds(duration: dict | None) -> float | None:
  """A google.protobuf.Duration message (seconds, nanos) in seconds."""
  if duration is None:
    return None
  return float(_first(duration, 'seconds', 0)) + float(_first(duration, 'nanos', 0)) * 1e-9


def _find(msg, key: str):
  """Every value of field `key` anywhere below msg."""
  if isinstance(msg, dict):
    for k, values in msg.items():
      for v in values:
        if k == key:
          yield v
        yield from _find(v, key)


def _label(log: dict) -> str:
  """A short name for the instruction a log entry is about."""
  fusion = _first(log, 'fusion_name')
  if fusion:
    return fusion
  hlo = _first(log, 'hlo_text')
  if hlo:
    return hlo.split('=', 1)[0].strip().lstrip('%')
  for text in _find(log, 'instruction'):
    if isinstance(text, str):
      return text.split('=', 1)[0].strip()[:60]
    for name in _find(text, 'name'):
      if isinstance(name, str):
        return name
  return '?'


_GROUPS = re.compile(r'feature_group_count=(\d+)')
_OP_NAME = re.compile(r'op_name=\\?"([^"\\]*)')


def _layer(hlo: str) -> str:
  """The model path of an instruction's op_name, 'backward: ' when autodiff's transpose made it."""
  m = _OP_NAME.search(hlo)
  if not m:
    return ''
  parts = m.group(1).split('/')
  path = '/'.join(p for p in parts[:-1] if '(' not in p)
  return ('backward: ' if 'transpose(' in m.group(1) else 'forward: ') + path


def summarize(tree: dict) -> dict:
  """Per instruction: candidates, failures, summed and best run time, the first's run time."""
  rows, backends = [], {}
  for log in tree.get('instruction_profiles', []) + tree.get('logs', []):
    times, failures = [], 0
    candidates = log.get('config_profiles', []) + log.get('results', [])
    for result in candidates:
      if 'failure' in result:
        failures += 1
      t = seconds(_first(result, 'run_time'))
      if t is not None and 'failure' not in result:
        times.append(t)
      backend = next((b for b in _find(result, 'backend') if isinstance(b, str)), '?')
      n, total = backends.get(backend, (0, 0.0))
      backends[backend] = (n + 1, total + (t or 0.0))
    hlo = _first(log, 'hlo_text', '')
    hlo = hlo if isinstance(hlo, str) else ''
    groups = _GROUPS.search(hlo)
    rows.append(
      {
        'label': _label(log),
        'groups': int(groups.group(1)) if groups else 1,
        'layer': _layer(hlo),
        'candidates': len(candidates),
        'failures': failures,
        'sum_s': sum(times),
        'best_s': min(times) if times else None,
        'first_s': times[0] if times else None,
      }
    )
  return {
    **_part(rows),
    'candidates': sum(r['candidates'] for r in rows),
    'failures': sum(r['failures'] for r in rows),
    'first_s': sum(r['first_s'] or 0.0 for r in rows),
    'rows': rows,
    'backends': backends,
    'grouped': _part([r for r in rows if r['groups'] > 1]),
    'ungrouped': _part([r for r in rows if r['groups'] == 1]),
  }


def _part(rows: list[dict]) -> dict:
  """Rows' count, candidates' summed time and summed best times."""
  return {
    'instructions': len(rows),
    'sum_s': sum(r['sum_s'] for r in rows),
    'best_s': sum(r['best_s'] or 0.0 for r in rows),
  }


def render(s: dict, top: int, sort: str = 'time') -> str:
  lines = [
    f'{s["instructions"]} instructions autotuned, {s["candidates"]} candidates timed '
    f'({s["failures"]} failed).',
    f'Candidates\' measured run times add up to {s["sum_s"]:.3f} s of GPU time (one measured '
    'run each as logged; the compile also spends host time building each candidate).',
    f'Sum of each instruction\'s best candidate: {1e3 * s["best_s"]:.2f} ms; of its first '
    f'listed candidate: {1e3 * s["first_s"]:.2f} ms'
    + (f' ({s["first_s"] / s["best_s"]:.2f}x)' if s['best_s'] else '')
    + ' (the first listed is what --autotune_level=0 takes if the log keeps the order tried).',
    'By backend: '
    + '; '.join(
      f'{b} {n} candidates, {t:.3f} s'
      for b, (n, t) in sorted(s['backends'].items(), key=lambda kv: -kv[1][1])
    )
    + '.',
    'Grouped convolutions (feature_group_count > 1; depthwise ones have one group a channel): '
    + _part_text(s['grouped'])
    + '; the other instructions: '
    + _part_text(s['ungrouped'])
    + '.',
    '',
    '| instruction | groups | layer | candidates | failed | candidates\' time ms | best ms '
    '| first ms |',
    '|---|---|---|---|---|---|---|---|',
  ]
  key = (lambda r: -r['sum_s']) if sort == 'time' else (lambda r: -(r['best_s'] or 0.0))
  for r in sorted(s['rows'], key=key)[:top]:
    best = '' if r['best_s'] is None else f'{1e3 * r["best_s"]:.3f}'
    first = '' if r['first_s'] is None else f'{1e3 * r["first_s"]:.3f}'
    lines.append(
      f'| {r["label"]} | {r["groups"]} | {r["layer"]} | {r["candidates"]} | {r["failures"]} | '
      f'{1e3 * r["sum_s"]:.1f} | '
      f'{best} | {first} |'
    )
  return '\n'.join(lines)


def _part_text(part: dict) -> str:
  return (
    f'{part["instructions"]} instructions, best candidates {1e3 * part["best_s"]:.2f} ms, '
    f'candidates\' time {part["sum_s"]:.3f} s'
  )


def main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('log')
  p.add_argument('--top', type=int, default=15)
  p.add_argument('--sort', choices=('time', 'best'), default='time')
  a = p.parse_args(argv)
  try:
    with (gzip.open if a.log.endswith('.gz') else open)(a.log, 'rt') as f:
      tree = parse(f.read())
  except (OSError, ValueError) as e:
    print(f'autotune_log: {e}', file=sys.stderr)
    return 2
  print(render(summarize(tree), a.top, a.sort))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
