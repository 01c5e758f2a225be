"""Where a compile's autotuning went, from XLA's own log lines in a job's log, even a cut one.

scripts/h200_session.sh runs its jobs with TF_CPP_VMODULE=config_assigner=1,autotuner=1, so
XLA's autotuner writes a line (glog's prefix: level, date, time of day, thread, file:line) as
it looks up an instruction, starts to tune it, and settles it. Unlike the autotuning log
(--autotune_log, written when the compile ends), these lines are there when the queue cuts a
compile at its deadline. This prints how many lines of each kind came (by their first words:
"Getting config for HLO", "Picked best config", ...), the span they cover, and the longest
silences between consecutive autotuner lines, each with the line before it: where the time went.

  python3 scripts/autotune_progress.py JOB.log [--top N] [--files autotuner,config_assigner]
"""

import argparse
import collections
import datetime
import re
import sys

# glog/absl: I1201 13:11:17.653634     557 config_assigner.cc:212] message
_LINE = re.compile(
  r'^(?P<level>[IWEF])(?P<mmdd>\d{4}) (?P<time>\d\d:\d\d:\d\d\.\d+)\s+\d+\s+'
  r'(?P<file>[\w.\-]+):(?P<line>\d+)\] (?P<message>.*)$'
)
_KIND_WORDS = 4  # a line's kind: its first words, before any HLO text


def read(lines, files: tuple[str, ...]) -> list[tuple[datetime.datetime, str, str]]:
  """(time, file, message) of each log line from one of `files` (stem, e.g. 'autotuner')."""
  events, year = [], 2000  # glog writes no year; only differences are used
  for raw in lines:
    m = _LINE.match(raw.rstrip('\n'))
    if not m or m['file'].rsplit('.', 1)[0] not in files:
      continue
    when = datetime.datetime.strptime(f'{year}{m["mmdd"]} {m["time"]}', '%Y%m%d %H:%M:%S.%f')
    events.append((when, m['file'], m['message']))
  events.sort(key=lambda e: e[0])
  return events


def kind(message: str) -> str:
  head = re.split(r'[:=(]', message, maxsplit=1)[0]
  return ' '.join(head.split()[:_KIND_WORDS])


def summary(events, top: int = 10) -> str:
  if not events:
    return (
      'no autotuner lines: was TF_CPP_VMODULE set for the job (scripts/h200_session.sh sets '
      'it), and does this XLA honour it?'
    )
  span = (events[-1][0] - events[0][0]).total_seconds()
  out = [
    f'{len(events)} autotuner lines from {events[0][0]:%H:%M:%S} to {events[-1][0]:%H:%M:%S}'
    f' ({span:.0f} s)',
    '',
    '| lines | kind |',
    '|---|---|',
  ]
  for name, n in collections.Counter(kind(m) for _, _, m in events).most_common():
    out.append(f'| {n} | {name} |')
  gaps = sorted(((b[0] - a[0]).total_seconds(), a) for a, b in zip(events, events[1:]))[::-1][:top]
  out += ['', f'The {len(gaps)} longest silences, each after the line that began it:', '']
  for seconds, (when, file, message) in gaps:
    text = message if len(message) <= 160 else message[:157] + '...'
    out.append(f'- {seconds:.1f} s after {when:%H:%M:%S} {file}: {text}')
  return '\n'.join(out)


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('log')
  parser.add_argument('--top', type=int, default=10)
  parser.add_argument('--files', default='autotuner,config_assigner')
  args = parser.parse_args(argv)
  with open(args.log, errors='replace') as f:
    events = read(f, tuple(args.files.split(',')))
  print(summary(events, args.top))
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
