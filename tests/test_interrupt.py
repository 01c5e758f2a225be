"""A Ctrl-C (SIGINT) stops a run at any moment, its first second (JAX's import) included."""

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu'}

IN_A_GC_CALLBACK = '''
import gc, os, signal, time
from jaxbench.core import interrupt
interrupt.install()
fired = []
def callback(phase, info):  # as JAX's _xla_gc_callback: Python code run by every collection
  if not fired:
    fired.append(1)
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100000):  # the signal is handled here, inside the callback
      pass
gc.callbacks.append(callback)
gc.collect()
try:
  time.sleep(5)
  print('not interrupted')
except KeyboardInterrupt:
  print('interrupted after the collection')
'''


def test_a_sigint_inside_a_gc_callback_is_raised_after_it():
  done = subprocess.run(
    [sys.executable, '-c', IN_A_GC_CALLBACK], env=ENV, capture_output=True, text=True, timeout=30
  )
  assert done.stdout == 'interrupted after the collection\n'
  assert 'Exception ignored' not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize('after_s', [0.3, 0.6, 0.8, 1.0, 1.2, 1.5])
def test_a_sigint_in_a_runs_first_second_stops_it(after_s):
  run = [
    sys.executable,
    '-m',
    'jaxbench.main',
    '--model=bert_base',
    '--tiny',
    '--steps=1',
    '--windows=1',
  ]
  proc = subprocess.Popen(run, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  time.sleep(after_s)
  proc.send_signal(signal.SIGINT)
  t0 = time.monotonic()
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err.decode()[-2000:]
  assert time.monotonic() - t0 < 10  # not the whole run: on two CPU cores it takes 40 s
  assert b'Exception ignored' not in err and err.endswith(b'jaxbench: interrupted\n')


IN_AN_IMPORT = '''
import os, signal, sys, time
from jaxbench.core import interrupt
interrupt.install()
open('slow_module.py', 'w').write(
  'import os, signal, time\\nos.kill(os.getpid(), signal.SIGINT)\\nt = time.monotonic()\\n'
  'while time.monotonic() - t < 0.5:\\n  pass\\nDONE = True\\n')
sys.path.insert(0, '.')
try:
  import slow_module
  time.sleep(5)
  print('not interrupted')
except KeyboardInterrupt:
  # The interrupt may land on any line after the import; the import itself ran to its end.
  print('interrupted after the import:', getattr(sys.modules.get('slow_module'), 'DONE', False))
'''


def _script(code: str, where) -> subprocess.CompletedProcess:
  """`code` run by a fresh Python in the directory `where`."""
  return subprocess.run(
    [sys.executable, '-c', code], cwd=where, env=ENV, capture_output=True, text=True, timeout=30
  )


def test_a_sigint_during_an_import_is_raised_after_it(tmp_path):
  done = _script(IN_AN_IMPORT, tmp_path)
  assert done.stdout == 'interrupted after the import: True\n', done.stderr


IN_A_PLUGIN_START = '''
import os, signal, sys, time
from jaxbench.core import interrupt
interrupt.install()
# The shape of JAX's xla_bridge.discover_pjrt_plugins: each plugin's initialize() under a bare
# except, which would log a KeyboardInterrupt and go on.
open('xla_bridge.py', 'w').write(
  'import os, signal, time\\n'
  'def discover_pjrt_plugins():\\n'
  '  try:\\n'
  '    os.kill(os.getpid(), signal.SIGINT)\\n'
  '    t = time.monotonic()\\n'
  '    while time.monotonic() - t < 0.5:\\n'
  '      pass\\n'
  '  except:\\n'
  '    print("swallowed")\\n'
  '  return True\\n')
sys.path.insert(0, '.')
import xla_bridge
try:
  done = xla_bridge.discover_pjrt_plugins()
  time.sleep(5)
  print('not interrupted')
except KeyboardInterrupt:
  print('interrupted after the plugins started:', done)
'''


def test_a_sigint_while_jax_starts_its_plugins_is_raised_after_it(tmp_path):
  done = _script(IN_A_PLUGIN_START, tmp_path)
  assert done.stdout == 'interrupted after the plugins started: True\n', done.stderr


IN_A_BARE_EXCEPT = '''
import os, signal, time
from jaxbench.core import interrupt
interrupt.install()
def broadcast_shapes():  # the shape of JAX's lax.broadcast_shapes: any exception, another way
  try:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100000):  # the signal is handled here, inside the try
      pass
  except:
    pass
  return 'the other way'
how = broadcast_shapes()
t = time.monotonic()
try:
  time.sleep(5)
  print('not interrupted')
except KeyboardInterrupt:
  print(f'interrupted again after {how}', 0.5 < time.monotonic() - t < 3)
'''


def test_a_sigint_that_a_bare_except_drops_is_raised_again():
  done = _script(IN_A_BARE_EXCEPT, '.')
  assert done.stdout == 'interrupted again after the other way True\n', done.stderr


TAKEN = '''
import os, signal, time
from jaxbench.core import interrupt
interrupt.install()
try:
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(5)
except KeyboardInterrupt:
  interrupt.taken()
try:
  time.sleep(3)  # what the handler does after it took the interrupt: written, not cut short
  print('taken once')
except KeyboardInterrupt:
  print('raised again')
'''


def test_a_taken_sigint_is_not_raised_again():
  done = _script(TAKEN, '.')
  assert done.stdout == 'taken once\n', done.stderr
