"""Flags of the report (python -m jaxbench.report_main); --store is defined in flags/store.py."""

from absl import flags

OUT = flags.DEFINE_string(
  'out', None, 'Write the report (Markdown, CSV, PNG) in this directory, made if missing.'
)
REFERENCE_GPU = flags.DEFINE_string(
  'reference_gpu',
  'quadro_rtx_8000',
  'Express throughput relative to this catalog GPU, as the 2020 benchmark did with the Quadro '
  'RTX 8000.',
)
