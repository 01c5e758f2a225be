"""A run at --autotune_level says so: in jaxbench's notes and in scripts/summarize.py's rows."""

import os
import sys

from jaxbench import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'scripts'))

import summarize  # noqa: E402

FLAGS = '--xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0 --xla_disable_hlo_passes=x'


def test_the_level_is_read_from_the_runs_xla_flags():
  assert report.autotune_level({'xla_flags': FLAGS}) == 0
  assert (
    report.autotune_level({'xla_flags': '--xla_gpu_autotune_level=4 --xla_gpu_autotune_level=2'})
    == 2
  )
  assert report.autotune_level({'xla_flags': '--xla_gpu_enable_triton_gemm=false'}) is None
  assert report.autotune_level({}) is None


def test_the_script_reads_it_as_the_package_does():
  for flags in (FLAGS, '', '--xla_gpu_autotune_level=3'):
    assert summarize.autotune_level({'xla_flags': flags}) == report.autotune_level(
      {'xla_flags': flags}
    )


def test_a_summary_row_names_the_level_beside_the_overrides():
  r = {'workload': 'stylegan', 'overrides': [['depthwise', 'shifts']], 'xla_flags': FLAGS}
  assert summarize.workload(r) == 'stylegan (depthwise=shifts, autotune level 0)'
  assert summarize.workload({**r, 'overrides': []}) == 'stylegan (autotune level 0)'
  assert summarize.workload({**r, 'xla_flags': ''}) == 'stylegan (depthwise=shifts)'
