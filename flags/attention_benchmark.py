"""Flags of the attention benchmark (python -m jaxbench.attention_benchmark); it takes --models
from flags/benchmarks.py, --tiny, --warmup_steps, --steps and --windows from flags/run.py and
--precisions from flags/sweep.py."""

from absl import flags

BLOCKS = flags.DEFINE_multi_string(
  'blocks',
  [],
  'A tiling of the fused kernels to time beside their default, as BLOCK_Q,BLOCK_K,BLOCK_BWD,'
  'WARPS,WARPS_BWD,STAGES (e.g. --blocks=64,64,64,4,4,2); repeat the flag for more.',
)
FIELDS = ('block_q', 'block_k', 'block_bwd', 'warps', 'warps_bwd', 'stages')


def _valid_blocks(values: list[str]) -> bool:
  for value in values:
    parts = value.split(',')
    if len(parts) != len(FIELDS) or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
      return False
    q, k, bwd = (int(p) for p in parts[:3])
    if any(b < 16 or b & (b - 1) for b in (q, k, bwd)):
      return False
  return True


flags.register_validator(
  BLOCKS,
  _valid_blocks,
  message=f'each must be {",".join(f.upper() for f in FIELDS)}: six positive integers, the '
  'three blocks powers of two of at least 16',
)


def blocks() -> list[dict[str, int]]:
  """--blocks as the fused kernels' `blocks` dicts."""
  return [dict(zip(FIELDS, (int(p) for p in value.split(',')))) for value in BLOCKS.value]
