"""The max-batch search replayed on the forecasts of recorded searches: what today's search rule
would have compiled, and found, in each search a store holds (jaxbench/core/replay.py).

    python -m jaxbench.search_replay --store=docs/results/h200.jsonl,docs/results/h100.jsonl
    python -m jaxbench.search_replay --store=sweep.jsonl --tolerance=0

Each JAX search that ran under a memory budget without hints and ended on its own is searched
again against a program whose forecast is the line through the recorded ones, compiling nothing:
a row each with the compiles and maximum (in examples) recorded and replayed, then the averages.
Between recorded batches the forecast is the line's, not XLA's, so a replay is a measure of the
search's aim, not a prediction of a new run.
"""

import functools
import statistics

from absl import app, flags

from flags import search_replay as replay_flags
from flags import store as store_flags
from jaxbench import cli

flags.adopt_module_key_flags(replay_flags)
flags.declare_key_flag('store')

_fail = functools.partial(cli.fail, 'jaxbench.search_replay')
HEADER = (
  'workload',
  'precision',
  'device',
  'budget GB',
  'tolerance',
  'compiles recorded',
  'replayed',
  'max recorded',
  'replayed',
)


def rows(replays) -> list[tuple]:
  """The table: a row per search, then the mean compiles recorded and replayed."""
  out = [
    (r.workload, r.precision, r.device, f'{r.budget_bytes / 1e9:.1f}', r.tolerance)
    + (r.recorded_compiles, r.compiles, r.recorded_max, r.max_examples)
    + ((r.error,) if r.error else ())
    for r in replays
  ]
  recorded = statistics.mean(r.recorded_compiles for r in replays)
  replayed = statistics.mean(r.compiles for r in replays)
  out.append((f'mean of {len(replays)}', '', '', '', '', f'{recorded:.2f}', f'{replayed:.2f}'))
  return out


def main(argv: list[str]) -> int:
  del argv  # cli.flags_parser refuses arguments that are not flags
  from jaxbench.core import replay  # pylint: disable=g-import-not-at-top
  from jaxbench.results import store  # pylint: disable=g-import-not-at-top

  paths = [p for p in (store_flags.STORE.value or '').split(',') if p]
  if not paths:
    _fail('give --store=FILE[,FILE...] (results in JSON Lines)')
  for path in paths:
    problem = store.not_a_store(path)  # no file, or empty, or no line of it a result
    if problem:
      _fail(f'--store: {problem}')
  replays = replay.replay_stores(paths, replay_flags.TOLERANCE.value)
  if not replays:
    _fail('--store: no search to replay (a JAX max-batch search under a budget, without hints)')
  cli.print_columns(HEADER, rows(replays), left=3)
  return 0


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser('jaxbench.search_replay'))
