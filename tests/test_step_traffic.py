"""python -m jaxbench.step_traffic: the bytes of each kernel of a compiled step, read from XLA's
optimized HLO text (jaxbench/core/traffic.py), and bad input refused in one line."""

import subprocess
import sys

import pytest

from jaxbench import step_traffic
from jaxbench.core import traffic

# A module as XLA prints an optimized program: a fused computation and a reducer (code of other
# kernels, not kernels), a while loop whose body and condition run as the program's own code.
HLO = """HloModule jit_step, entry_computation_layout={(bf16[8,16]{1,0}, bf16[16,4]{1,0})->f32[4]{0}}

%fused_convert (param_0: bf16[8,4]) -> f32[8,4] {
  %param_0 = bf16[8,4]{1,0} parameter(0)
  ROOT %convert.1 = f32[8,4]{1,0} convert(%param_0)
}

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %add.9 = f32[] add(%x, %y)
}

%fused_add (param_0.1: f32[4], param_1: f32[4]) -> f32[4] {
  %param_0.1 = f32[4]{0} parameter(0)
  %param_1 = f32[4]{0} parameter(1)
  ROOT %add.1 = f32[4]{0} add(%param_0.1, %param_1)
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %v.1 = f32[4]{0} get-tuple-element(%p), index=1
  %loop_add_fusion.2 = f32[4]{0} fusion(%v.1, %v.1), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/while/body/add"}
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %loop_add_fusion.2)
}

%cond (p.1: (s32[], f32[4])) -> pred[] {
  %p.1 = (s32[], f32[4]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %three = s32[] constant(3)
  ROOT %lt = pred[] compare(%i.1, %three), direction=LT
}

ENTRY %main (a: bf16[8,16], b: bf16[16,4]) -> f32[4] {
  %a = bf16[8,16]{1,0} parameter(0)
  %b = bf16[16,4]{1,0} parameter(1)
  %custom-call.1 = (bf16[8,4]{1,0}, s8[32]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/jvp(Model)/layer_3/dense/dot_general"}
  %product = bf16[8,4]{1,0} get-tuple-element(%custom-call.1), index=0
  %wrapped_convert = f32[8,4]{1,0} fusion(%product), kind=kLoop, calls=%fused_convert, metadata={op_name="jit(step)/jvp(Model)/layer_12/convert_element_type"}
  %zero = f32[] constant(0)
  %v = f32[4]{0} reduce(%wrapped_convert, %zero), dimensions={0}, to_apply=%sum
  %start = s32[] constant(0)
  %init = (s32[], f32[4]{0}) tuple(%start, %v)
  %w = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[4]{0} get-tuple-element(%w), index=1
}
"""  # noqa: E501 (XLA's lines)


def test_each_kernel_reads_its_operands_and_writes_its_result():
  ks = {k.name: k for k in traffic.kernels(HLO)}
  assert sorted(ks) == ['custom-call.1', 'loop_add_fusion.2', 'lt', 'v', 'wrapped_convert']
  gemm = ks['custom-call.1']
  assert (gemm.opcode, gemm.kind) == ('custom-call', '__cublas$gemm')
  assert (gemm.read_bytes, gemm.written_bytes) == (8 * 16 * 2 + 16 * 4 * 2, 8 * 4 * 2 + 32)
  convert = ks['wrapped_convert']  # reads the tuple's element, not the whole tuple
  assert (convert.kind, convert.read_bytes, convert.written_bytes) == ('kLoop', 64, 128)
  assert (ks['v'].opcode, ks['v'].bytes) == ('reduce', 128 + 4 + 16)
  # The loop's body, counted once; the array it takes as both operands is read once.
  assert ks['loop_add_fusion.2'].bytes == 4 * 4 * 2
  assert ks['lt'].bytes == 4 + 4 + 1
  assert gemm.op_name == 'jit(step)/jvp(Model)/layer_3/dense/dot_general'


def test_totals_and_groups():
  ks = traffic.kernels(HLO)
  assert traffic.totals(ks) == {
    'fusions': 192 + 32,
    'library calls': 384 + 96,
    'other operations': 148 + 9,
  }
  by_kind = traffic.group(ks, 'kind')
  assert by_kind[0] == ('custom-call __cublas$gemm', 1, 480)
  assert ('fusion kLoop wrapped_convert', 1, 192) in by_kind
  by_op = dict((key, b) for key, _, b in traffic.group(ks, 'op', depth=2))
  assert by_op['jvp(Model)/layer_N'] == 480 + 192  # layers 3 and 12 folded into one row
  assert by_op['(no op name)'] == 148 + 9
  with pytest.raises(ValueError, match='group by kind or op'):
    traffic.group(ks, 'layer')


HASHES = """HloModule jit_step

%fused_hash (k: u32[2], c: u32[6,4]) -> pred[6,4] {
  %c = u32[6,4]{1,0} parameter(1)
  %thirteen = u32[] constant(13)
  %b = u32[6,4]{1,0} broadcast(%thirteen), dimensions={}
  %shift-left.1 = u32[6,4]{1,0} shift-left(%c, %b)
  %shift-left.2 = u32[6,4]{1,0} shift-left(%shift-left.1, %b)
  %packed = u8[6,4]{1,0} shift-left(%c, %b)
  ROOT %keep = pred[6,4]{1,0} compare(%shift-left.2, %c), direction=LT
}

ENTRY %main (k: u32[2], c: u32[6,4], s: u32[3]) -> (pred[6,4], u32[3]) {
  %k = u32[2]{0} parameter(0)
  %c = u32[6,4]{1,0} parameter(1)
  %s = u32[3]{0} parameter(2)
  %mask = pred[6,4]{1,0} fusion(%k, %c), kind=kLoop, calls=%fused_hash
  %again = pred[6,4]{1,0} fusion(%k, %c), kind=kLoop, calls=%fused_hash
  %one = u32[3]{0} shift-left(%s, %s)
  ROOT %out = (pred[6,4]{1,0}, u32[3]{0}) tuple(%mask, %one)
}
"""


def test_the_hashes_are_the_32_bit_shift_lefts_over_a_hash_s_rotations():
  """Each fusion counts the shift-lefts of the computation it runs, a computation two fusions
  share twice; an unfused one counts its own; 8-bit shifts (a mask's packing) are not a hash's."""
  ks = {k.name: k for k in traffic.kernels(HASHES)}
  assert (ks['mask'].shifted, ks['again'].shifted, ks['one'].shifted) == (48, 48, 3)
  assert traffic.threefry_hashes(list(ks.values())) == (48 + 48 + 3) // traffic.ROTATIONS


def test_a_text_without_an_entry_is_refused():
  with pytest.raises(ValueError, match='no ENTRY computation'):
    traffic.kernels('HloModule m\n')


def test_a_compiled_step_moves_more_bytes_at_a_larger_batch():
  """The tiny preset compiled on this machine's device: every kernel found, and twice the
  examples move more bytes (the batch's activations) but not twice the parameters' bytes."""
  args = dict(
    precision_name='fp32', overrides={}, tiny=True, target=None, by='kind', depth=3, top=50
  )
  two = step_traffic.report('bert_base', batch=None, **args)
  four = step_traffic.report('bert_base', batch=4, **args)
  assert two[0].startswith('bert_base fp32 at 2 sequences (2 examples): ')
  assert four[0].startswith('bert_base fp32 at 4 sequences (4 examples): ')

  def moved(line):
    value, unit = line.split(' kernels, ')[1].split(' read and written')[0].split()
    return float(value) * {'kB': 1e3, 'MB': 1e6, 'GB': 1e9}[unit]

  assert moved(four[0]) > moved(two[0])
  assert len(two) > 10  # the header, then a row per group


@pytest.mark.parametrize(
  'args, message',
  [
    ([], '--models: name at least one workload'),
    (['--models=bert_huge'], 'bert_huge'),
    (['--models=bert_base', '--set=layers'], '--set expects KEY=VALUE'),
    (['--models=bert_base', '--set=heads=0'], 'heads'),
    (['--models=transformer_big', '--batch_size=1'], 'less than one example'),
    (['--models=bert_base', '--compile_for=b9000'], "unknown target 'b9000'"),
    (['--models=bert_base', '--by=layer'], 'value should be one of'),
  ],
)
def test_bad_input_is_refused_in_one_line(args, message):
  r = subprocess.run(
    [sys.executable, '-m', 'jaxbench.step_traffic', '--tiny', *args], capture_output=True, text=True
  )
  assert r.returncode == 2 and r.stdout == ''
  assert r.stderr.count('\n') == 1 and message in r.stderr, r.stderr
