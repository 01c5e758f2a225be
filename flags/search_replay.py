"""Flags of the search's replay on recorded forecasts (python -m jaxbench.search_replay); it takes
--store from flags/store.py."""

from absl import flags

from flags import validators

TOLERANCE = flags.DEFINE_float(
  'tolerance',
  None,
  'Replay every search at this tolerance (as --search_tolerance) instead of at its own.',
)
validators.fraction(TOLERANCE)
