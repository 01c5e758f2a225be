"""timing.windows, the loop both frameworks time their steps with."""

from jaxbench.core import timing


def test_windows_sync_each_windows_last_output_and_time_the_first_call_to_its_sync():
  events = []
  outputs = iter(range(100))

  def step():
    out = next(outputs)
    events.append(('call', out))
    return out

  times, last, first_s = timing.windows(step, lambda o: events.append(('sync', o)), 2, 3, 4)
  assert len(times) == 4 and all(t >= 0 for t in times)
  assert last == 13  # 2 warm-up calls, then 4 windows of 3
  assert first_s is not None and first_s >= 0
  calls = [o for e, o in events if e == 'call']
  syncs = [o for e, o in events if e == 'sync']
  assert calls == list(range(14))
  # the first warm-up call, the warm-up's end, then each window's last call, nothing between
  assert syncs == [0, 1, 4, 7, 10, 13]


def test_windows_without_warm_up_have_no_first_call_time():
  synced = []
  times, last, first_s = timing.windows(lambda: 'y', synced.append, 0, 1, 2)
  assert (len(times), last, first_s) == (2, 'y', None)
  assert synced == [None, 'y', 'y']  # the warm-up's end holds no output yet
