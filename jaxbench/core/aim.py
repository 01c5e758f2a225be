"""Where the max-batch search probes next: the line through the forecasts, a gallop or bisection."""

from jaxbench.core.probe import Trial


def line_guess(
  trials: list[Trial],
  budget: int | None,
  lo: int,
  hi: int | None,
  hints: dict[int, int] | None = None,
) -> int | None:
  """The largest n whose predicted peak fits the budget, from the probes so far.

  With a bracket, interpolate between its two ends (regula falsi: the guess
  stays inside). Without one, and with hints (predicted peaks from earlier
  searches), take the line through the known points nearest the budget.
  Without hints, extrapolate from the two largest fits; after the first probe
  alone, assume all of its temporaries scale with the batch: an over-estimate
  of the per-example memory, so the guess is short of the boundary but lands
  on the linear part of the curve, far from the fixed costs (parameters,
  optimizer state) that dominate at one example.
  """
  if budget is None:
    return None
  peaks = {t.examples: t.predicted_peak_bytes for t in trials if t.predicted_peak_bytes}
  if lo in peaks and hi in peaks:
    (n0, p0), (n1, p1) = (lo, peaks[lo]), (hi, peaks[hi])
  elif hints and len(hints) >= 2 and any(hints.get(n, p) != p for n, p in peaks.items()):
    # The hints disagree with this search's own forecast at a batch both have: they come from
    # another compile (deviceless, without autotuning), a few percent off in level, and a line
    # through one of theirs and one of ours would aim far off (simulated with stylegan bf16's
    # deviceless hints and its fp32 gap of 4.8%: 166 images over, then 165, a probe wasted).
    # So: our forecast nearest the budget, and the hints' slope over their whole range.
    n0, p0 = min(peaks.items(), key=lambda pt: abs(pt[1] - budget))
    (a, pa), (b, pb) = min(hints.items()), max(hints.items())
    (n1, p1) = (n0 + 1, p0 + (pb - pa) / (b - a))
  elif hints and len({**hints, **peaks}) >= 2:
    (n0, p0), (n1, p1) = _nearest_pair({**hints, **peaks}, budget)
  else:
    fits = sorted((n, p) for n, p in peaks.items() if n <= lo)
    if len(fits) >= 2:
      (n0, p0), (n1, p1) = fits[-2:]
    elif len(fits) == 1:
      first = next(t for t in trials if t.examples == fits[0][0])
      per_example = max(first.predicted_temp_bytes or 0, 1)
      return fits[0][0] + max(int((budget - fits[0][1]) // per_example), 1)
    else:
      return None
  slope = (p1 - p0) / (n1 - n0)
  if slope <= 0:
    return None
  return int(n0 + (budget - p0) // slope)


def _nearest_pair(peaks: dict[int, int], budget: int) -> tuple[tuple[int, int], tuple[int, int]]:
  """Two (n, peak) points to draw the line through: the largest under the budget and the
  smallest over it; with points on one side only, the nearest one and the farthest (a long
  baseline, so that a few GB of noise in XLA's forecast moves the slope little)."""
  points = sorted(peaks.items())
  under = [pt for pt in points if pt[1] <= budget]
  over = [pt for pt in points if pt[1] > budget]
  if under and over:
    return under[-1], over[0]
  if under:
    return under[0], under[-1]
  return over[0], over[-1]


def allowed(n: int, multiple: int) -> bool:
  """Whether a batch of n examples is one the workload runs: any below `multiple`, else a
  multiple of it (fairseq's --required-batch-size-multiple; 1: any)."""
  return n < multiple or n % multiple == 0


def snap(n: int, lo: int, hi: int | None, multiple: int) -> int | None:
  """The batch the workload runs nearest to n strictly between lo and hi (the lower of two as
  near), or None where there is none."""
  below = n if allowed(n, multiple) else n - n % multiple  # n >= multiple here: below >= it
  above = n if allowed(n, multiple) else below + multiple
  inside = [c for c in (below, above) if lo < c and (hi is None or c < hi)]
  if not inside:  # n lies outside (lo, hi): the first batch run above lo, if below hi
    first = lo + 1 if allowed(lo + 1, multiple) else lo - lo % multiple + multiple
    inside = [first] if hi is None or first < hi else []
  return min(inside, key=lambda c: (abs(c - n), c)) if inside else None


def closed(lo: int, hi: int | None, tolerance: float, multiple: int = 1) -> bool:
  """Whether the largest fit `lo` and the smallest failure `hi` are close enough to stop: no
  batch the workload runs between them (one example apart, where it runs any), or within
  `tolerance` x lo."""
  if hi is None:
    return False
  return hi - lo <= max(1, int(tolerance * lo)) or snap(lo + 1, lo, hi, multiple) is None


def _closers(lo: int, hi: int, tolerance: float) -> tuple[int, int]:
  """The largest batch whose failure would close the bracket (lo, hi) within the tolerance,
  and the smallest whose fit would."""
  up = lo + max(1, int(tolerance * lo))
  down = int(hi / (1 + tolerance))
  while down > lo + 1 and closed(down - 1, hi, tolerance):
    down -= 1
  while not closed(down, hi, tolerance):
    down += 1
  return up, down


def next_probe(
  trials: list[Trial],
  budget: int | None,
  lo: int,
  hi: int | None,
  max_examples: int,
  gallop: int,
  line_missed: bool,
  hints: dict[int, int] | None = None,
  tolerance: float = 0.0,
  multiple: int = 1,
) -> tuple[int, str | None]:
  """Where to probe next, given the largest fit `lo` and smallest failure `hi`: a batch the
  workload runs (snap), nearest to where the rules below aim.

  The line's guess when it falls strictly inside the bracket. When the line points at or beyond
  an edge of the bracket, gallop from that edge (steps 1, 2, 4, ... so a boundary just beside a
  probe costs a few probes; with a tolerance, the first step as long as the tolerance allows),
  never past the middle. Without a line, or once a gallop has crossed the boundary (the line is
  wrong here): doubling, then bisection. Returns n and the gallop's direction ('up' from lo,
  'down' from hi, or None).
  """
  n, direction = _aim(trials, budget, lo, hi, max_examples, gallop, line_missed, hints, tolerance)
  snapped = snap(n, lo, min(hi, max_examples + 1) if hi is not None else max_examples + 1, multiple)
  return (n if snapped is None else snapped), direction


def _aim(trials, budget, lo, hi, max_examples, gallop, line_missed, hints, tolerance):
  """next_probe's aim, before it is snapped to a batch the workload runs."""
  probed = {t.examples for t in trials}
  guess = line_guess(trials, budget, lo, hi, hints)
  inside = guess is not None and guess > lo and (hi is None or guess < hi)
  if guess is None or (line_missed and not inside):
    return (min(2 * lo, max_examples) if hi is None else (lo + hi) // 2), None
  if hi is None:
    if inside and guess not in probed:
      return min(guess, max_examples), None
    return min(lo + gallop, max_examples), 'up'
  # With a tolerance the search need not find the boundary, only a bracket within it: a probe
  # the line puts just above lo (a failure) or just below hi (a fit) goes to the farthest batch
  # whose likely outcome still ends the search; where one batch ends it either way, there.
  up, down = _closers(lo, hi, tolerance) if tolerance > 0 else (lo + 1, hi - 1)
  if inside and not line_missed:
    guess = min(max(guess, down), up) if down <= up else up if guess < up else min(guess, down)
  if lo < guess < hi and guess not in probed:
    return guess, None
  mid = (lo + hi) // 2
  if guess <= lo:
    return max(min(max(lo + gallop, up), mid), lo + 1), 'up'
  return min(max(min(hi - gallop, down), mid), hi - 1), 'down'
