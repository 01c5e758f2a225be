"""A run at --autotune_level says so in jaxbench's notes: the level is read from its XLA flags."""

from jaxbench.results import records as report

FLAGS = '--xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0 --xla_disable_hlo_passes=x'


def test_the_level_is_read_from_the_runs_xla_flags():
  assert report.autotune_level({'xla_flags': FLAGS}) == 0
  assert (
    report.autotune_level({'xla_flags': '--xla_gpu_autotune_level=4 --xla_gpu_autotune_level=2'})
    == 2
  )
  assert report.autotune_level({'xla_flags': '--xla_gpu_enable_triton_gemm=false'}) is None
  assert report.autotune_level({}) is None
