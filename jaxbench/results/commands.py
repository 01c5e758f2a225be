"""The command that reproduces a result, rebuilt from its fields, and what the recorded program
had that today's workload does not (an earlier form: another revision, config keys or values).

Results do not store their command line. The command runs the recorded configuration today as
nearly as today's workload can: the recorded overrides it accepts, and --set for each recorded
config value that differs from today's default (a default changed since); what it cannot set is
what earlier_form names.
"""

import json
from typing import Any

from jaxbench import cli
from jaxbench.cards import catalog
from jaxbench.results import records, store
from models import registry


def _workload(name: str):
  try:
    return registry.get(name)
  except KeyError:
    return None


def _plain(value: Any) -> Any:
  """A value as JSON gives it back (tuples as lists), so recorded and current configs compare."""
  return json.loads(json.dumps(value, default=str))


def _accepted(w, tiny: bool, sets: dict[str, str]) -> dict[str, Any] | None:
  try:
    return w.resolve(tiny, sets)
  except (ValueError, TypeError):
    return None


def _settable(value: Any) -> bool:
  # A scalar whose text --set parses back to the recorded value (lists and booleans are left out).
  return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _today(r: dict[str, Any]):
  """The --set pairs under which today's workload runs the record's configuration as nearly as
  it can, and the configuration that gives: the record's overrides that today's workload
  accepts, then each other recorded key whose value differs from today's and is accepted."""
  w = _workload(r['workload'])
  if w is None:
    return None, [(str(k), str(v)) for k, v in r.get('overrides') or []], None
  tiny = bool(r.get('tiny'))
  sets: dict[str, str] = {}
  for key, value in r.get('overrides') or []:
    if _accepted(w, tiny, {**sets, key: value}) is not None:
      sets[key] = value
  config = r.get('config') or {}
  current = _plain(w.resolve(tiny, sets))
  for key in sorted(config):
    value = config[key]
    if key in current and current[key] != _plain(value) and _settable(value):
      if _accepted(w, tiny, {**sets, key: str(value)}) is not None:
        sets[key] = str(value)
  return w, list(sets.items()), _plain(w.resolve(tiny, sets))


def default_config(r: dict[str, Any]) -> bool:
  """Whether the run trained today's workload as it comes: its configuration is the preset's
  default, whether or not a --set named a default value."""
  w = _workload(r['workload'])
  if w is None:
    return False
  default = _accepted(w, bool(r.get('tiny')), {})
  return default is not None and _plain(default) == _plain(r.get('config') or {})


def keys_off_default(r: dict[str, Any]) -> int:
  """How many of the run's config keys differ from today's default configuration (0: the
  workload as it comes). Of two runs of an earlier form, the one with fewer is the nearer to it."""
  w = _workload(r['workload'])
  default = None if w is None else _accepted(w, bool(r.get('tiny')), {})
  config = _plain(r.get('config') or {})
  if default is None:
    return len(config)
  default = _plain(default)
  return sum(key not in default or default[key] != value for key, value in config.items())


def changing_sets(r: dict[str, Any]) -> tuple[tuple[str, str], ...]:
  """The run's --set pairs less those that name the default value (which change no program)."""
  w = _workload(r['workload'])
  sets = tuple((str(k), str(v)) for k, v in r.get('overrides') or ())
  if w is None:
    return sets
  tiny = bool(r.get('tiny'))
  default = _accepted(w, tiny, {})
  return tuple(kv for kv in sets if default is None or _accepted(w, tiny, dict([kv])) != default)


def earlier_form(r: dict[str, Any]) -> str | None:
  """What the recorded program had that today's workload, under command_of's --set flags, does
  not: another revision, config keys today's workload lacks or values it no longer takes.
  None where the command runs the recorded program today."""
  w, _, current = _today(r)
  if w is None:
    return f'earlier form: {r["workload"]} is not a workload today'
  parts = []
  if store.revision(r) != w.revision:
    parts.append(f'revision {store.revision(r)}')
  config = r.get('config') or {}
  for key in sorted(config):
    if key not in current or current[key] != _plain(config[key]):
      parts.append(f'{key}={config[key]}')
  return 'earlier form: ' + '; '.join(parts) if parts else None


def _fixed_batch(r: dict[str, Any]) -> int:
  """The batch a --batch_size run was asked for, per device, in the workload's unit: its one
  trial's, kept whether or not the batch fitted or ran to the end (max_batch is 0 then)."""
  trials = (r.get('search') or {}).get('trials') or []
  return trials[0]['batch'] if trials else r['max_batch']


def command_of(r: dict[str, Any]) -> str:
  """The python -m jaxbench.main command that reproduces a result, from its fields: workload,
  precision, preset, config (--set), memory, batch, timing, search and compiler settings.

  Flags that do not change what is measured (output files, caches, search hints) are left out;
  precision and timing are given even at their defaults, which may change. A JAX run under
  another PRNG than JAX's default, or with XLA flags of its own, gets the environment variables
  that chose them."""
  args = [*records.environment(r), 'python', '-m', 'jaxbench.main', f'--model={r["workload"]}']
  args.append(f'--precision={r["precision"]}')
  if r.get('tiny'):
    args.append('--tiny')
  if records.framework(r) != 'jax':
    args.append(f'--framework={records.framework(r)}')
    if r.get('torch_compile'):
      args.append('--torch_compile')
  args += [f'--set={k}={v}' for k, v in _today(r)[1]]
  emu = r.get('emulation') or {}
  memory = r.get('memory') or {}
  if emu.get('gpu', '').startswith('mem_'):
    args.append(f'--memory_gb={emu["memory_gb"]:g}')
  elif emu.get('gpu'):
    args.append(f'--gpu={emu["gpu"]}')
  elif memory.get('limit_bytes'):
    args.append(f'--memory_limit_gb={memory["limit_bytes"] / 1e9:g}')
  if memory.get('remat'):
    args.append('--remat')
  device = r.get('device') or {}
  search = r.get('search') or {}
  if r.get('mode') == 'predict':
    args.append('--predict')
    if device.get('deviceless'):
      args.append(
        f'--compile_for={catalog.of_device(device.get("kind", "")) or device.get("kind")}'
      )
  par = r.get('parallel') or {}
  if par.get('local_devices', 1) > 1:
    args.append(f'--devices={par["local_devices"]}')
  if par.get('shard_optimizer'):
    args.append('--shard_optimizer')
  if par.get('scaling'):
    args.append('--scaling')
  if search.get('mode') == 'fixed':  # --batch_size is the global batch; a trial's is per device
    args.append(f'--batch_size={_fixed_batch(r) * par.get("global_devices", 1)}')
  if search.get('capped'):
    args.append(f'--max_examples={r["max_examples"]}')
  tolerance = search.get('tolerance') or 0.0
  if search.get('mode') != 'fixed' and tolerance != cli.SEARCH_TOLERANCE:
    args.append(f'--search_tolerance={tolerance:g}')
  probes = {t.get('autotune_level') for t in search.get('trials') or []} - {None}
  if len(probes) == 1:
    args.append(f'--probe_autotune_level={probes.pop()}')
  if search.get('run_every_fit') is False:
    args.append('--norun_every_fit')
  level = records.autotune_level(r)
  if level is not None:
    args.append(f'--autotune_level={level}')
  if 'xla_flags' in r and '--xla_gpu_enable_triton_gemm=false' not in (r['xla_flags'] or ''):
    args.append('--triton_gemm')
  m = r.get('measurement') or {}
  windows = len(m.get('window_step_s') or [])
  if m.get('warmup_steps') is not None:
    args.append(f'--warmup_steps={m["warmup_steps"]}')
  if windows and m.get('steps_per_window'):
    args += [f'--steps={m["steps_per_window"] * windows}', f'--windows={windows}']
  return ' '.join(args)
