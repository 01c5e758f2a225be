"""The published 2020 tables (jaxbench/data/lambda2020.csv, notes in lambda2020.md)."""

import csv
import dataclasses
import functools
import importlib.resources

from jaxbench.cards import catalog

# The published transformer_big and conv_seq2seq language rows are swapped (see lambda2020.md):
# each holds the other's figures, in the precision the other was trained in.
SWAPPED = ('transformer_big', 'conv_seq2seq')
SWAP_NOTE = (
  'The published transformer_big and conv_seq2seq rows are swapped: the author\'s own '
  'result files show the published "Transformer Big" throughput equals ConvS2S (FP32) at '
  'max_tokens 2000, and the published "Conv Seq2Seq" rows equal Transformer Big (FP16) '
  'at its largest batch. The values stay under their published names here, so the '
  'transformer_big row holds FP32 figures and the conv_seq2seq row FP16 ones.'
)
SOURCE = (
  'Lambda, "Choosing the best GPU for deep learning in 2020", and the per-model result '
  'files its author published'
)


@dataclasses.dataclass(frozen=True)
class Row:
  """One published (workload, GPU) figure; max_batch 0 means the model did not fit."""

  workload: str
  gpu: str  # catalog name
  display: str
  memory_gb: float
  price_usd_2020: float
  max_batch: int
  batch_unit: str
  throughput: float
  throughput_unit: str
  precision: str  # what the figures were measured in: for a swapped row, its partner's precision

  @property
  def swapped(self) -> bool:
    return self.workload in SWAPPED

  @property
  def figures_of(self) -> str:
    """The workload whose 2020 run the figures come from: the other of a swapped pair."""
    if not self.swapped:
      return self.workload
    return SWAPPED[1 - SWAPPED.index(self.workload)]


@functools.cache
def rows() -> tuple[Row, ...]:
  text = importlib.resources.files('jaxbench').joinpath('data/lambda2020.csv').read_text()
  out = []
  for r in csv.DictReader(text.splitlines()):
    out.append(
      Row(
        workload=r['workload'],
        gpu=catalog.by_display(r['gpu']).name,
        display=r['gpu'],
        memory_gb=float(r['gpu_memory_gb']),
        price_usd_2020=float(r['gpu_price_usd_2020']),
        max_batch=int(r['max_batch']),
        batch_unit=r['batch_unit'],
        throughput=float(r['throughput']),
        throughput_unit=r['throughput_unit'],
        precision=r['precision'],
      )
    )
  return tuple(out)


def workloads() -> list[str]:
  """The twelve workloads in the published tables' order."""
  return list(dict.fromkeys(r.workload for r in rows()))


def gpus() -> list[str]:
  """The eight 2020 GPUs (catalog names) in the published tables' order."""
  return list(dict.fromkeys(r.gpu for r in rows()))


def lookup() -> dict[tuple[str, str], Row]:
  """(workload, catalog GPU name) -> published row."""
  return {(r.workload, r.gpu): r for r in rows()}


def trained_precision() -> dict[str, str]:
  """Workload -> the precision its 2020 run trained in ('fp32?' where the article did not say):
  that of the figures measured from it, which for a swapped pair sit under the other's name."""
  return {r.figures_of: r.precision for r in rows()}


def precision_note() -> str:
  """One line: the precision the published figures were measured in, row by row."""
  by_row = {r.workload: r for r in rows()}
  precisions = [r.precision for r in by_row.values()]
  usual = max(set(precisions), key=precisions.count)
  unsure = [w for w, r in by_row.items() if r.precision == usual + '?']
  text = f'The published figures were measured in {usual.upper()}'
  if unsure:
    text += f' ({", ".join(unsure)}: presumably, the original\'s code is unknown)'
  others = [
    f'the figures under {w}, which are {r.figures_of}\'s, in {r.precision.upper()}'
    if r.figures_of != w
    else f'{w}\'s in {r.precision.upper()}'
    for w, r in by_row.items()
    if r.precision.rstrip('?') != usual
  ]
  return text + (f', except {"; ".join(others)}.' if others else '.')


def notes() -> str:
  return importlib.resources.files('jaxbench').joinpath('data/lambda2020.md').read_text()
