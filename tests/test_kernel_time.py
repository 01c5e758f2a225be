"""A traced window's GPU kernels summed per step, by the compiled step's kernel kinds and JAX
operations (jaxbench/core/kernel_time.py), on a trace written as XLA's profiler writes a GPU's."""

import os
import time

import pytest
from jax import profiler

from jaxbench.core import kernel_time, traffic

HLO = """HloModule jit_step

%fused_add (p0: f32[256,256], p1: f32[256,256]) -> f32[256,256] {
  %p0 = f32[256,256]{1,0} parameter(0)
  %p1 = f32[256,256]{1,0} parameter(1)
  ROOT %add.0 = f32[256,256]{1,0} add(%p0, %p1)
}

ENTRY %main (a: f32[256,256], b: f32[256,256]) -> f32[256,256] {
  %a = f32[256,256]{1,0} parameter(0)
  %b = f32[256,256]{1,0} parameter(1)
  %cublas-lt-matmul.1 = (f32[256,256]{1,0}, s8[4]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/model/layer_0/dense/dot_general"}
  %get-tuple-element.1 = f32[256,256]{1,0} get-tuple-element(%cublas-lt-matmul.1), index=0
  ROOT %loop_add_fusion.2 = f32[256,256]{1,0} fusion(%get-tuple-element.1, %b), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/model/layer_1/add"}
}
"""  # noqa: E501 (XLA's lines)
ARRAY = 256 * 256 * 4
MATMUL, FUSION = 'custom-call __cublas$lt$matmul', 'fusion kLoop loop_add_fusion'

# Two steps: each a product (1 ms) and an add (0.25 ms) on a stream, and a copy no instruction of
# the step names (0.1 ms). The "XLA Ops" line repeats the product, as a tool's derived lines do;
# the host's plane has a kernel-like event too. Neither is counted.
STEP = [
  ('nvjet_tst_128x256_64x4', 'cublas-lt-matmul.1', 1.0),
  ('loop_add_fusion', 'loop_add_fusion.2', 0.25),
  ('MemcpyD2D', None, 0.1),
]


def _xspace(steps: int = 2) -> str:
  """A trace's text: a GPU plane with the kernels of `steps` steps, and a host plane."""
  names = sorted({name for name, _, _ in STEP})
  ops = sorted({op for _, op, _ in STEP if op})
  event_id = {name: i + 1 for i, name in enumerate(names)}
  op_id = {op: 100 + i for i, op in enumerate(ops)}
  events, offset = [], 0
  for _ in range(steps):
    for name, op, ms in STEP:
      stat = f' stats {{ metadata_id: 1 ref_value: {op_id[op]} }}' if op else ''
      events.append(
        f'events {{ metadata_id: {event_id[name]} offset_ps: {offset} '
        f'duration_ps: {int(ms * 1e9)}{stat} }}'
      )
      offset += int(ms * 1e9) + 1000
  metadata = ''.join(
    f'event_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }}\n' for n, i in event_id.items()
  )
  metadata += 'stat_metadata { key: 1 value { id: 1 name: "hlo_op" } }\n'
  metadata += ''.join(
    f'stat_metadata {{ key: {i} value {{ id: {i} name: "{op}" }} }}\n' for op, i in op_id.items()
  )
  return f"""
planes {{
  id: 1
  name: "/device:GPU:0"
  lines {{ id: 1 name: "Stream #13(Compute)" timestamp_ns: 1000 {' '.join(events)} }}
  lines {{ id: 2 name: "XLA Ops" {events[0]} }}
  {metadata}
}}
planes {{
  id: 2
  name: "/host:CPU"
  lines {{ id: 1 name: "python" {events[0]} }}
  {metadata}
}}
"""


@pytest.fixture
def summary():
  events = kernel_time.gpu_kernels(profiler.ProfileData.from_text_proto(_xspace()))
  return kernel_time.summarize(events, traffic.kernels(HLO), steps=2)


def test_the_kernels_on_the_gpus_streams_are_read_with_their_instruction():
  events = kernel_time.gpu_kernels(profiler.ProfileData.from_text_proto(_xspace(steps=1)))
  assert [(e.name, e.hlo_op, e.ns) for e in events] == [
    ('nvjet_tst_128x256_64x4', 'cublas-lt-matmul.1', 1e6),
    ('loop_add_fusion', 'loop_add_fusion.2', 0.25e6),
    ('MemcpyD2D', '', 0.1e6),
  ]


def test_a_window_is_summed_per_step(summary):
  assert summary['steps'] == 2
  assert summary['kernel_ms_per_step'] == pytest.approx(1.35)
  assert summary['kernels_per_step'] == 3


def test_time_falls_in_the_groups_of_the_steps_bytes(summary):
  by_kind = {r['group']: r for r in summary['by_kind']}
  assert by_kind[MATMUL] == {'group': MATMUL, 'kernels': 1, 'ms': 1.0, 'bytes': 3 * ARRAY + 4}
  assert by_kind[FUSION] == {'group': FUSION, 'kernels': 1, 'ms': 0.25, 'bytes': 3 * ARRAY}
  assert by_kind[kernel_time.OTHER] == {'group': kernel_time.OTHER, 'kernels': 1, 'ms': 0.1}
  assert [r['group'] for r in summary['by_kind']] == [MATMUL, FUSION, kernel_time.OTHER]
  by_op = {r['group']: r['ms'] for r in summary['by_op']}
  assert by_op == {'model/layer_N/dense': 1.0, 'model/layer_N/add': 0.25, kernel_time.OTHER: 0.1}


def test_the_printed_lines_give_shares_and_rates(summary):
  text = '\n'.join(kernel_time.lines('toy', summary))
  assert 'toy: the traced window, per step: 1.35 ms of GPU kernels, 3 kernels' in text
  # The add moved 3 arrays of 256 KiB in 0.25 ms: 3.15 GB/s is 0.00 TB/s; the share is 18.5%.
  add = next(line for line in text.splitlines() if line.endswith(FUSION))
  assert '18.5%' in add and f'{3 * ARRAY / 0.25e-3 / 1e12:5.2f} TB/s' in add
  other = next(line for line in text.splitlines() if line.endswith(kernel_time.OTHER))
  assert 'TB/s' not in other  # no instruction of the step: no bytes to divide


def test_a_trace_without_gpu_kernels_says_so(tmp_path):
  assert kernel_time.read(str(tmp_path)) == []  # no trace at all
  empty = kernel_time.summarize([], traffic.kernels(HLO), steps=4)
  assert empty == {
    'steps': 4,
    'kernel_ms_per_step': 0.0,
    'kernels_per_step': 0,
    'by_kind': [],
    'by_op': [],
  }
  assert kernel_time.lines('toy', empty) == ['  toy: the trace holds no GPU kernels']


def test_the_newest_trace_is_read(tmp_path):
  old, new = tmp_path / 'a' / 'host.xplane.pb', tmp_path / 'b' / 'host.xplane.pb'
  for i, path in enumerate((old, new)):
    path.parent.mkdir()
    path.write_bytes(profiler.ProfileData.text_proto_to_serialized_xspace(_xspace(steps=i + 1)))
    os.utime(path, (time.time() + i, time.time() + i))
  assert kernel_time.trace_file(str(tmp_path)) == str(new)
  assert len(kernel_time.read(str(tmp_path))) == 2 * len(STEP)


def test_a_trace_that_cannot_be_read_loses_nothing_but_its_summary(tmp_path):
  (tmp_path / 'host.xplane.pb').write_bytes(b'not an XSpace')
  broken = kernel_time.of_window(str(tmp_path), HLO, steps=3)
  assert broken['steps'] == 3 and broken['error']
  assert kernel_time.lines('toy', broken) == [
    f'  toy: the trace could not be summed: {broken["error"]}'
  ]
  fine = kernel_time.of_window(str(tmp_path / 'none'), HLO, steps=3)
  assert fine['kernels_per_step'] == 0 and 'error' not in fine
