"""What the flag modules share: the precision names, and validators of what absl's bounds
leave out (NaN, infinity, exclusive bounds of floats).

absl prefixes a failed validator's message with the flag and its value (`flag --x=nan: ...`).
This module defines no flag, so that a command imports only the flags it takes.
"""

import math

from absl import flags

# The names of models.precision.POLICIES (tests/test_flags.py checks that they agree).
PRECISION_NAMES = ('fp32', 'tf32', 'bf16', 'fp16')


def positive(holder: flags.FlagHolder, unit: str) -> None:
  """The float flag, when given, must be a finite number above zero."""
  flags.register_validator(
    holder,
    lambda v: v is None or (math.isfinite(v) and v > 0),
    message=f'must be a positive, finite number of {unit}',
  )


def fraction(holder: flags.FlagHolder) -> None:
  """The float flag must lie in [0, 1)."""
  flags.register_validator(
    holder, lambda v: v is None or 0 <= v < 1, message='must be at least 0 and less than 1'
  )
