"""The bytes each kernel of a compiled program reads and writes, from XLA's optimized HLO text.

A kernel here is an instruction of the program's entry computation, or of a computation that a
while loop, a conditional or a call runs from it: a fusion, a library call (cuBLAS, cuDNN,
Triton), or an unfused operation. Its traffic is the bytes of its operands and of its result,
counted once per place in the program (a loop's body once, however many times it runs). That is
what the kernel moves if it reads each operand once, a bound that fusions and library calls on
a GPU come close to; it is a way to weigh two forms of one step against each other without
running either, not a time.

The same text counts the threefry hashes a step computes (its dropout masks', its random
numbers'), arithmetic that no byte count shows: threefry_hashes().
"""

import collections
import dataclasses
import re

_BYTES = {
  'pred': 1,
  's4': 0.5,
  'u4': 0.5,
  's8': 1,
  'u8': 1,
  'f8e4m3fn': 1,
  'f8e5m2': 1,
  's16': 2,
  'u16': 2,
  'f16': 2,
  'bf16': 2,
  's32': 4,
  'u32': 4,
  'f32': 4,
  's64': 8,
  'u64': 8,
  'f64': 8,
  'c64': 8,
  'c128': 16,
}
_ARRAY = re.compile(r'\b(' + '|'.join(_BYTES) + r')\[([0-9,]*)\]')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?) ([a-z][a-z0-9\-]*)\((.*)$')
_HEADER = re.compile(r'^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$')
# Operations that move no data of their own: they name, group or pick buffers.
_NO_KERNEL = {
  'parameter',
  'constant',
  'get-tuple-element',
  'tuple',
  'bitcast',
  'after-all',
  'partition-id',
  'replica-id',
  'opt-barrier',
  'while',
  'conditional',
  'call',
}
# A threefry-2x32 hash rotates its words 20 times, each rotation a 32-bit shift-left (and a
# shift-right and an or) where XLA unrolls it, as for a GPU; on a CPU JAX rolls the rounds into a
# loop, whose body is counted once.
ROTATIONS = 20
_U32_SHIFT_LEFT = re.compile(r'= u32\[([0-9,]*)\](?:\{[0-9,]*\})? shift-left\(')
_CALLS = re.compile(r'\bcalls=%?([\w.\-]+)')
# The attributes that name the computations a while loop, a conditional or a call runs.
_RUNS = re.compile(
  r'\b(?:body|condition|to_apply|true_computation|false_computation)=%?([\w.\-]+)'
  r'|\bbranch_computations=\{([^}]*)\}'
)


def _elements(dims: str) -> int:
  """The elements of an HLO array of dimensions 'd0,d1,...' ('' for a scalar)."""
  n = 1
  for d in dims.split(','):
    if d:
      n *= int(d)
  return n


def array_bytes(shape: str) -> int:
  """The bytes of every array in an HLO shape (a tuple's elements summed)."""
  return int(sum(_BYTES[dtype] * _elements(dims) for dtype, dims in _ARRAY.findall(shape)))


@dataclasses.dataclass(frozen=True)
class Kernel:
  name: str
  opcode: str  # fusion, custom-call, or the unfused operation's
  kind: str  # a fusion's kind (kLoop, kInput, kCustom, ...), a library call's target, or ''
  read_bytes: int  # its operands', each array once however many operands it is
  written_bytes: int
  op_name: str  # the JAX operation it came from (its metadata), '' if none
  shifted: int = 0  # elements of its 32-bit shift-lefts (a fusion's, in the computation it runs)

  @property
  def bytes(self) -> int:
    return self.read_bytes + self.written_bytes


def _computations(text: str) -> tuple[dict[str, list[str]], str | None]:
  """Each computation's instruction lines, by name, and the entry computation's name."""
  comps: dict[str, list[str]] = {}
  entry, current = None, None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header and not line.startswith(' '):
      current = header.group(2)
      comps[current] = []
      if header.group(1):
        entry = current
    elif line.strip() == '}':
      current = None
    elif current is not None:
      comps[current].append(line)
  return comps, entry


def _shifted(comps: dict[str, list[str]], comp: str) -> int:
  """The elements of the 32-bit shift-lefts of a fused computation and of those it calls."""
  total = 0
  for line in comps.get(comp, []):
    m = _U32_SHIFT_LEFT.search(line)
    if m:
      total += _elements(m.group(1))
    called = _CALLS.search(line)
    if called:
      total += _shifted(comps, called.group(1))
  return total


def kernels(text: str) -> list[Kernel]:
  """The kernels of an optimized HLO module's text (`compiled.as_text()`): the entry
  computation's in order, then those of each computation it runs (loops, conditionals, calls)."""
  comps, entry = _computations(text)
  if entry is None:
    raise ValueError('no ENTRY computation in the HLO text')
  out, seen, pending = [], set(), [entry]  # computations whose instructions run as kernels
  while pending:
    comp = pending.pop(0)
    if comp in seen or comp not in comps:
      continue
    seen.add(comp)
    sizes: dict[str, int] = {}
    for line in comps[comp]:
      m = _INSTRUCTION.match(line)
      if not m:
        continue
      name, shape, opcode, rest = m.groups()
      sizes[name] = array_bytes(shape)
      if opcode in ('while', 'conditional', 'call'):  # computations it runs as code of their own
        for one, many in _RUNS.findall(rest):
          pending.extend([one] if one else [c.strip().lstrip('%') for c in many.split(',')])
      if opcode in _NO_KERNEL:
        continue
      operands = re.findall(r'%([\w.\-]+)', rest.split(')', 1)[0])
      kind = re.search(r'\bkind=(k\w+)|custom_call_target="([^"]*)"', rest)
      op_name = re.search(r'op_name="([^"]*)"', rest)
      called = _CALLS.search(rest) if opcode == 'fusion' else None
      shift = _U32_SHIFT_LEFT.search(line)
      shifted = _shifted(comps, called.group(1)) if called else 0
      out.append(
        Kernel(
          name=name,
          opcode=opcode,
          kind=(kind.group(1) or kind.group(2)) if kind else '',
          read_bytes=sum(sizes.get(o, 0) for o in dict.fromkeys(operands)),
          written_bytes=sizes[name],
          op_name=op_name.group(1) if op_name else '',
          shifted=shifted + (_elements(shift.group(1)) if shift else 0),
        )
      )
  return out


def threefry_hashes(ks: list[Kernel]) -> int:
  """The threefry-2x32 hashes the kernels compute: their 32-bit shift-lefts' elements over
  ROTATIONS. Exact for a program compiled for a GPU whose only 32-bit shift-lefts are threefry's
  rotations (jax.random's, models/layers/threefry_bits'), as the workloads' steps are."""
  return sum(k.shifted for k in ks) // ROTATIONS


def _layer_path(op_name: str, depth: int) -> str:
  """The first `depth` parts of a JAX op name, with numbered layers folded (decoder_3 ->
  decoder_N) so that a stack's layers add up in one row."""
  parts = op_name.split('/')
  if parts and parts[0].startswith('jit('):
    parts = parts[1:]
  parts = [re.sub(r'_\d+$', '_N', re.sub(r'_\d+\.', '_N.', p)) for p in parts[:depth]]
  return '/'.join(parts) or '(no op name)'


def key(k: Kernel, by: str, depth: int = 3) -> str:
  """The row a kernel falls in. `by`: 'kind' (a fusion's kind and the stem of its name, a
  library call's target, an operation's opcode) or 'op' (the JAX op name's first `depth`
  parts)."""
  if by == 'kind':
    stem = re.sub(r'\.\d+$', '', k.name)
    row = f'{k.opcode} {k.kind} {stem}' if k.opcode == 'fusion' else f'{k.opcode} {k.kind}'
  elif by == 'op':
    row = _layer_path(k.op_name, depth)
  else:
    raise ValueError(f'group by kind or op, not {by!r}')
  return row.strip()


def group(ks: list[Kernel], by: str, depth: int = 3) -> list[tuple[str, int, int]]:
  """(key, kernels, bytes) rows, the largest first, each kernel in its key()'s row."""
  total: collections.Counter = collections.Counter()
  count: collections.Counter = collections.Counter()
  for k in ks:
    row = key(k, by, depth)
    total[row] += k.bytes
    count[row] += 1
  return [(row, count[row], b) for row, b in total.most_common()]


def totals(ks: list[Kernel]) -> dict[str, int]:
  """The bytes of the fusions, of the library calls and of the other operations."""
  out = {'fusions': 0, 'library calls': 0, 'other operations': 0}
  for k in ks:
    part = {'fusion': 'fusions', 'custom-call': 'library calls'}.get(k.opcode, 'other operations')
    out[part] += k.bytes
  return out
