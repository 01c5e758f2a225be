"""Ctrl-C (SIGINT) honoured at any moment of a run, its first second included.

Python raises KeyboardInterrupt wherever its main thread checks for signals next, and four
kinds of place in a run cannot take it:
- JAX runs a callback at every garbage collection (jax._src.lib._xla_gc_callback, in
  gc.callbacks). An exception raised inside a gc callback (or a __del__) is printed ("Exception
  ignored in: <function _xla_gc_callback>") and dropped: the run goes on as if never interrupted.
- An import: a KeyboardInterrupt inside the initialization of a compiled module (numpy's, under
  JAX's import) can leave it half-made, and the process ends in an ImportError or a segfault.
- JAX's start of its PJRT plugins (xla_bridge.discover_pjrt_plugins, where the CUDA plugin loads
  its libraries) calls each plugin's initialize() under a bare `except:`, which logs a
  KeyboardInterrupt as a plugin error and goes on.
- Any other bare `except:` drops it without a word. JAX's tracing has several on its busiest
  paths (core.is_constant_dim; lax.broadcast_shapes, which tries another way on any exception),
  so a Ctrl-C while a compile traces its program could be lost and the run go on to its end.
install() puts in a handler that raises KeyboardInterrupt as Python's own does, except in the
first three: there it sends the SIGINT again a moment later, until the collection, the import
or the plugins' start is over, so that it is raised in the run's own code. Against the fourth,
an interrupt stays pending until the code that handles it says so (taken()), and is raised
again every _PENDING_S until then. A flag checked at chosen points would miss the long
stretches (an import, a compile) that have none; blocking SIGINT until JAX is imported would
miss the collections of every compile after it.
Before install() can be reached, while the command's own modules load, exit_while_loading()
ends the process at once: nothing has been written yet, and an import cut short is never used.
"""

import _thread
import gc
import os
import signal
import sys
import time

_RETRY_S = 0.05  # when a SIGINT that arrived in a gc callback or an import is sent again
# When a raised KeyboardInterrupt that nothing has taken is raised again: longer than the run's
# own unwinding to its handler takes, so that a second one does not cut into a `finally`.
_PENDING_S = 1.0
_IMPORT = '<frozen importlib'  # the frames of the import machinery
# Functions that catch every exception, KeyboardInterrupt included: (name, file name).
_SWALLOWING = {('discover_pjrt_plugins', 'xla_bridge.py')}


def _unsafe_here(frame) -> bool:
  """Whether a KeyboardInterrupt raised in `frame` would be dropped (a gc callback, a __del__ or
  a function in _SWALLOWING runs in it or below it) or could break an import (one is in
  progress)."""
  callbacks = {getattr(cb, '__code__', None) for cb in gc.callbacks}
  while frame is not None:
    code = frame.f_code
    if code in callbacks or code.co_name == '__del__' or code.co_filename.startswith(_IMPORT):
      return True
    if (code.co_name, os.path.basename(code.co_filename)) in _SWALLOWING:
      return True
    frame = frame.f_back
  return False


_pending = False  # a SIGINT has come that no handler has taken
_resent = False  # the next SIGINT is one that _send_again sent


def _send_again(signum: int) -> None:
  global _resent
  if _pending:
    _resent = True
    os.kill(os.getpid(), signum)


def _later(delay_s: float, signum: int) -> None:
  """_send_again(signum) in delay_s, from a thread of its own. A bare _thread, not a
  threading.Timer: the handler may run while the main thread holds threading's own lock (in a
  Thread.start()), which a Timer's start would wait for forever."""

  def wait_then_send():
    time.sleep(delay_s)
    _send_again(signum)

  _thread.start_new_thread(wait_then_send, ())


def _on_sigint(signum, frame) -> None:
  global _pending, _resent
  if _resent:
    _resent = False
    if not _pending:  # taken since it was sent
      return
  _pending = True
  if _unsafe_here(frame):
    _later(_RETRY_S, signum)
    return
  _later(_PENDING_S, signum)  # in case a bare `except:` drops this one
  raise KeyboardInterrupt


def taken() -> None:
  """Say that a KeyboardInterrupt has reached the code that handles it (which writes what the
  run found, stops a child, or exits): the SIGINT is no longer sent again. Without install(),
  nothing to do."""
  global _pending
  _pending = False


def _exit_on_sigint(signum, frame) -> None:
  del signum, frame
  os.write(2, f'{_loading_prog}: interrupted\n'.encode())
  os._exit(130)  # pylint: disable=protected-access


_loading_prog = ''


def exit_while_loading(prog: str) -> None:
  """Until install(): a SIGINT ends the process with status 130 and '<prog>: interrupted' on
  stderr, without a traceback. For a command's first lines, before its module-level imports
  (absl's, the flag modules'), which run before install() can be reached."""
  global _loading_prog
  _loading_prog = prog
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _exit_on_sigint)


def install() -> None:
  """Put in the handler above, where SIGINT has Python's own or exit_while_loading's (a process
  started with SIGINT ignored, e.g. in the background of a script, keeps it ignored)."""
  if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _exit_on_sigint):
    signal.signal(signal.SIGINT, _on_sigint)


def exit_now(status: int) -> None:
  """Exit without waiting for an abandoned compile or step (teardown under it can crash), and
  without importing JAX (an interrupt may have stopped its import half-way)."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access
