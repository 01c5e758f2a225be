"""Ctrl-C (SIGINT) honoured at any moment of a run, its first second included.

Python raises KeyboardInterrupt wherever its main thread checks for signals next. A run's first
seconds import JAX and compile, and JAX runs a callback at every garbage collection
(jax._src.lib._xla_gc_callback, in gc.callbacks). An exception raised inside a gc callback (or a
__del__) is printed ("Exception ignored in: <function _xla_gc_callback>") and dropped, and the
run goes on as if it had never been interrupted. install() puts in a handler that raises
KeyboardInterrupt as Python's own does, except inside such a callback: there it sends the
SIGINT again a moment later, when the collection is over, so the next check raises it in the
run's own code. A flag checked at chosen points would miss the long stretches (an import, a
compile) that have none; blocking SIGINT until JAX is imported would miss the collections of
every compile after it.
"""

import gc
import os
import signal
import sys
import threading

_RETRY_S = 0.05  # when a SIGINT that arrived inside a gc callback is sent again


def _dropped_here(frame) -> bool:
  """Whether an exception raised in `frame` would be printed and dropped: a gc callback or a
  __del__ is running in it or below it."""
  callbacks = {getattr(cb, '__code__', None) for cb in gc.callbacks}
  while frame is not None:
    if frame.f_code in callbacks or frame.f_code.co_name == '__del__':
      return True
    frame = frame.f_back
  return False


def _on_sigint(signum, frame) -> None:
  if _dropped_here(frame):
    timer = threading.Timer(_RETRY_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()
    return
  raise KeyboardInterrupt


def install() -> None:
  """Put in the handler above, where SIGINT has Python's own (a process started with SIGINT
  ignored, e.g. in the background of a script, keeps it ignored)."""
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _on_sigint)


def exit_now(status: int) -> None:
  """Exit without waiting for an abandoned compile or step (teardown under it can crash), and
  without importing JAX (an interrupt may have stopped its import half-way)."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access
