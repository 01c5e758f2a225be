"""Flags of the report command (python -m jaxbench.report_main); --store comes from sweep."""

from absl import flags

OUT = flags.DEFINE_string('out', None, 'Directory for the Markdown, CSV and PNG files.')
REFERENCE_GPU = flags.DEFINE_string(
  'reference_gpu',
  'quadro_rtx_8000',
  'Normalize throughput to this catalog GPU (2020: the Quadro RTX 8000).',
)
