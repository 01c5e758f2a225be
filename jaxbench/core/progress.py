"""Where a long run is: a live line on a terminal (rich), nothing beyond the log's lines elsewhere.

A search spends minutes in one compile with nothing to print; on a terminal the live line shows
the phase (compiling batch N, running, building the initial state, timing), how long the phase
and the run have taken, and the search's bracket (largest batch that fits, smallest that does
not), redrawn every second below the log's lines. When stderr is not a terminal (a log file, a
sweep's cell, a test) or rich is missing, the log's plain lines are all there is.
"""

import os
import sys
import time
from typing import Any, TextIO


def clock(seconds: float) -> str:
  """Elapsed time as a clock: '7.3 s', '12:05', '1:02:03'."""
  if seconds < 60:
    return f'{seconds:.1f} s'
  m, s = divmod(int(seconds), 60)
  h, m = divmod(m, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m}:{s:02d}'


class Line:
  """The state that the live line shows; plain (no display) unless started on a terminal."""

  def __init__(self, name: str, unit: str, now=time.monotonic):
    self.name, self.unit, self.now = name, unit, now
    self.phase = 'starting'
    self.started = self.phase_started = now()
    self.fit: int | None = None  # largest batch that fits so far, in the unit
    self.fail: int | None = None  # smallest batch that does not

  def set_phase(self, phase: str) -> None:
    if phase != self.phase:
      self.phase, self.phase_started = phase, self.now()

  def trial(self, batch: int, fits: bool) -> None:
    if fits:
      self.fit = batch if self.fit is None else max(self.fit, batch)
    else:
      self.fail = batch if self.fail is None else min(self.fail, batch)

  def text(self) -> str:
    t = self.now()
    parts = [
      f'{self.name}: {self.phase}',
      f'{clock(t - self.phase_started)} (run {clock(t - self.started)})',
    ]
    if self.fit is not None or self.fail is not None:
      fit = 'none yet' if self.fit is None else f'{self.fit:,}'
      fail = 'none yet' if self.fail is None else f'{self.fail:,}'
      parts.append(f'fits {fit}, fails {fail} {self.unit}')
    return ' | '.join(parts)

  def __rich__(self) -> Any:
    from rich.text import Text  # pylint: disable=g-import-not-at-top

    # One line, cut at the terminal's width: a wrapped live line would leave its tail behind.
    return Text(self.text(), style='bold', no_wrap=True, overflow='ellipsis')


class Display:
  """A context manager around a run: the live line while it runs, on a terminal only."""

  def __init__(self, line: Line, stream: TextIO | None = None):
    self.line = line
    self.stream = stream
    self._live = None

  def __enter__(self) -> Line:
    stream = self.stream or sys.stderr
    if not _is_terminal(stream):
      return self.line
    try:
      from rich.console import Console  # pylint: disable=g-import-not-at-top
      from rich.live import Live  # pylint: disable=g-import-not-at-top
    except ImportError:
      return self.line
    # The log's lines (print to sys.stderr) go above the live line while it is shown.
    self._live = Live(
      self.line,
      console=Console(file=stream, width=_width(stream)),
      refresh_per_second=2,
      transient=True,
      redirect_stdout=False,
      redirect_stderr=True,
    )
    self._live.start()
    return self.line

  def __exit__(self, *exc: Any) -> None:
    if self._live is not None:
      self._live.stop()
      self._live = None


def _width(stream: TextIO) -> int | None:
  """The terminal's columns, from stderr itself (rich would ask stdin or stdout, which a
  redirection may have made files)."""
  try:
    return os.get_terminal_size(stream.fileno()).columns or None
  except (AttributeError, OSError, ValueError):
    return None


def _is_terminal(stream: TextIO) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False
