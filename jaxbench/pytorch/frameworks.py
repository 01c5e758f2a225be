"""--frameworks: the same run once per framework, each in a fresh process, side by side.

Each framework runs as `python -m jaxbench.main` with this command's flags, --framework=NAME and
--output to a file of its own, so that neither process shares memory, allocator or compiler
state with the other and each has the whole budget. This process imports neither framework's
runtime (JAX stays on the CPU here); it checks the flags for every framework first, then prints
each child's table as progress on stderr, and on stdout the results side by side with the ratios
(JAX over PyTorch). With --precisions each framework runs once per precision; with
--reference_batch once per workload, at its comparison batch (REFERENCE_BATCH); with
--torch_compile the PyTorch side runs eager and compiled, and the ratios are JAX over the better
of the two. With --output every record goes there, each child's in turn.
"""

import dataclasses
import functools
import os
import subprocess
import sys
import tempfile
from typing import Callable, Iterable

from jaxbench import cli
from jaxbench.cards import supervisor
from jaxbench.core import backend
from jaxbench.pytorch import usage
from jaxbench.results import records, store

# The batch at which each workload's JAX and PyTorch figures are compared on a large GPU
# (--reference_batch), in the workload's units: a fixed batch, the same for both sides, because
# the max batches differ and one --batch_size does not fit workloads measured in images,
# sequences and tokens. A batch in tokens becomes whole examples as --batch_size does
# (run_record.examples_for: rounded down, to a multiple of 8 sentences for fairseq's workloads:
# transformer_big's 16,384 tokens are 544 pairs, conv_seq2seq's 16,000 528).
REFERENCE_BATCH = {
  'bert_base': 64,  # sequences
  'bert_squad': 32,  # sequences
  'transformer_big': 16_384,  # tokens
  'nasnet_large': 32,  # images
  'mask_rcnn': 8,  # images
  'mt_dnn': 8,  # sequences
  'deeplabv3': 16,  # images
  'yolov3': 16,  # images
  'stylegan': 16,  # images
  'pix2pixhd': 1,  # images
  'conv_seq2seq': 16_000,  # tokens
  'unsupmt': 8_000,  # tokens
}

# The flags this command rewrites for each child (the others pass unchanged); those with values
# also come as `--flag value`.
_VALUED = ('--frameworks', '--output', '--framework', '--precisions', '--precision', '--model')
_REWRITTEN = (*_VALUED, '--tiny', '--notiny', '--reference_batch', '--noreference_batch')
_COMPILE = ('--torch_compile', '--notorch_compile')  # each PyTorch child gets its own
# XLA's options and the search's hints, which only the JAX children get (a PyTorch run refuses
# them).
_JAX_VALUED = tuple(name for _, name in usage.JAX_SIDE if name != '--triton_gemm')
_JAX_SIDE = (*_JAX_VALUED, '--triton_gemm', '--notriton_gemm')


@dataclasses.dataclass(frozen=True)
class Child:
  """One child process: a framework (PyTorch eager or compiled) at one precision, of the
  command's workloads or of one at its reference batch."""

  framework: str
  torch_compile: bool = False
  precision: str | None = None  # None: the command's --precision, if any
  model: str | None = None  # None: the command's --model
  batch_size: int | None = None  # None: the command's --batch_size, if any

  @property
  def run(self) -> str:
    """'jax', 'pytorch eager' or 'pytorch compiled'."""
    if self.framework != 'pytorch':
      return self.framework
    return 'pytorch compiled' if self.torch_compile else 'pytorch eager'

  @property
  def name(self) -> str:
    return ' '.join(x for x in (self.run, self.precision, self.model) if x)


def children(a: cli.Args, workloads) -> list[Child]:
  """The child processes of the command `a`, in order: each precision of --precisions, each
  workload when --reference_batch, each framework, PyTorch eager then compiled (--torch_compile).
  """
  precisions = list(dict.fromkeys(a.precisions)) or [a.precision]
  models = [(w.name, REFERENCE_BATCH[w.name]) for w in workloads] if a.reference_batch else [None]
  out = []
  for precision in precisions:
    for model in models:
      for framework in a.frameworks:
        modes = (False, True) if framework == 'pytorch' and a.torch_compile else (False,)
        for compiled in modes:
          name, batch = model or (None, None)
          out.append(Child(framework, compiled, precision, name, batch))
  return out


def child_args(argv: Iterable[str], child: Child, output: str, tiny: bool) -> list[str]:
  """This command's flags for `child`: --frameworks, --output and --framework replaced, the
  preset fixed to this command's, the child's precision, workload and batch where it has its
  own, and --torch_compile or --notorch_compile for the PyTorch side only."""
  own = {
    '--precision': child.precision is not None,
    '--precisions': True,
    '--model': child.model is not None,
    '--batch_size': child.batch_size is not None,
  }
  out, skip = [], False
  for arg in argv:
    if skip:
      skip = False
      continue
    name = arg.split('=', 1)[0]
    dropped = own[name] if name in own else name in _REWRITTEN
    jax_side = child.framework == 'pytorch' and name in _JAX_SIDE
    if dropped or jax_side or name in _COMPILE:
      skip = '=' not in arg and (name in (*_VALUED, *_JAX_VALUED) or name == '--batch_size')
      continue
    out.append(arg)
  extra = [f'--framework={child.framework}']
  if child.framework == 'pytorch':
    extra.append('--torch_compile' if child.torch_compile else '--notorch_compile')
  if child.precision is not None:
    extra.append(f'--precision={child.precision}')
  if child.model is not None:
    extra += [f'--model={child.model}', f'--batch_size={child.batch_size}']
  return [*out, *extra, f'--output={output}', '--tiny' if tiny else '--notiny']


def _plans(a: cli.Args) -> tuple[list[Child], list[str]]:
  """Every child of the command `a`, checked as each child's own command line would be: the
  children, and the warnings; cli.UsageError (one line) for what one of them cannot run."""
  try:
    usage.check_comparison(a)
  except usage.Refused as e:
    raise cli.UsageError(str(e)) from None
  base = dataclasses.replace(a, precisions=(), reference_batch=False)
  workloads = cli.resolve_models(a.model) if a.model else ()
  kids = children(a, workloads) if workloads else []
  warnings: list[str] = []
  checked = set()
  for kid in kids or [Child(a.frameworks[0])]:
    key = (kid.precision, kid.model)
    if key in checked:
      continue
    checked.add(key)
    one = dataclasses.replace(base, precision=kid.precision)
    if kid.model is not None:
      one = dataclasses.replace(one, model=(kid.model,), batch_size=kid.batch_size)
    plan = cli.plan(one)
    warnings += [w for w in plan.warnings if w not in warnings]
  return kids, warnings


def main(a: cli.Args, fail: Callable[[str], None], argv: list[str] | None = None) -> int:
  """Run each child of the command (children) in turn; the exit status is the worst of theirs."""
  env = dict(os.environ)  # the children start from the caller's environment
  tiny = a.tiny if a.tiny is not None else backend.gpu_total_bytes() is None
  os.environ['JAX_PLATFORMS'] = 'cpu'  # this process only checks and waits
  a = dataclasses.replace(a, tiny=tiny)
  try:
    kids, warnings = _plans(a)
  except cli.UsageError as e:
    fail(str(e))
  if a.check:
    for line in warnings:
      print(f'jaxbench: {line}', file=sys.stderr)
    names = ', '.join(dict.fromkeys(w.name for w in cli.resolve_models(a.model)))
    runs = ', '.join(dict.fromkeys(k.run for k in kids))
    precisions = f' in {", ".join(a.precisions)}' if a.precisions else ''
    batch = ' at their reference batches' if a.reference_batch else ''
    print(f'jaxbench: ok: the flags are valid for {names}{batch}{precisions} under {runs}')
    return 0
  argv = sys.argv[1:] if argv is None else argv
  try:
    with store.Lock(a.output, shared=True):  # not beside a sweep on the same store
      status, results, interrupted = _run_each(a, kids, argv, env)
  except store.Busy as e:
    fail(f'--output: {e}')
  print()
  print(records.side_by_side(results))
  if interrupted:
    print('jaxbench: interrupted', file=sys.stderr)
    return 130
  return status


def _run_each(a: cli.Args, kids: list[Child], argv: list[str], env: dict[str, str]):
  """Each child in turn: the worst exit status, every record they wrote, and whether a Ctrl-C
  stopped them.

  A child runs in a session of its own and dies with this process (as a sweep's cells do), so
  that none outlives the command holding the GPU. A Ctrl-C (SIGINT) here is passed to the
  running child, which writes its result so far ('interrupted'); the children after it do not
  start."""
  status, results = 0, []
  for kid in kids:
    with tempfile.TemporaryDirectory(prefix='jaxbench-') as tmp:
      path, table = os.path.join(tmp, 'child.jsonl'), os.path.join(tmp, 'child.out')
      cmd = [sys.executable, '-m', 'jaxbench.main', *child_args(argv, kid, path, a.tiny)]
      print(f'jaxbench: {kid.name}: {" ".join(cmd[1:])}', file=sys.stderr, flush=True)
      with open(table, 'w+', encoding='utf-8') as out:
        proc = subprocess.Popen(
          cmd,
          env=env,
          stdout=out,
          start_new_session=True,
          preexec_fn=functools.partial(supervisor.die_with_parent, os.getpid()),
        )
        returncode, _, interrupted = supervisor.wait(proc, None)
        out.seek(0)
        sys.stderr.write(out.read())  # the child's own table: progress, here
      status = max(status, returncode)
      produced, warning = store.read(path)
      if warning:
        print(warning, file=sys.stderr)
      for r in produced:
        results.append(r)
        if a.output:
          records.append_jsonl(a.output, r)
    if interrupted:
      return status, results, True
  return status, results, False
