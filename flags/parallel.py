"""Flags of data parallelism: how many local devices a run trains on, and the hosts it spans."""

from absl import flags

DEVICES = flags.DEFINE_string(
  'devices',
  '1',
  'Train data-parallel on this many of this host\'s devices (or "all"): the batch split over '
  'them, the parameters replicated. The batch searched is per device; a --batch_size is the '
  'global batch, a multiple of the device count in examples.',
)
flags.register_validator(
  DEVICES,
  lambda v: v == 'all' or (v.isdigit() and int(v) >= 1),
  message='must be "all" or a whole number of devices, at least 1',
)
SHARD_OPTIMIZER = flags.DEFINE_bool(
  'shard_optimizer',
  False,
  'Shard the optimizer state over the devices (ZeRO-1) instead of replicating it: less memory '
  'per device, so a larger batch, for a gather of the updates each step.',
)
SCALING = flags.DEFINE_bool(
  'scaling',
  False,
  'With more than one device, also time one device at the same per-device batch in the same '
  'process, and record the scaling efficiency (throughput at N / (N x throughput at 1)).',
)
COORDINATOR_ADDRESS = flags.DEFINE_string(
  'coordinator_address',
  None,
  'Several hosts: HOST:PORT of process 0, for jax.distributed.initialize. Default: '
  'JAX_COORDINATOR_ADDRESS, or what a SLURM job sets; neither: one host, nothing initialized.',
)
NUM_PROCESSES = flags.DEFINE_integer(
  'num_processes',
  None,
  'Several hosts: the number of processes (one per host). Default: JAX_NUM_PROCESSES or SLURM\'s.',
  lower_bound=1,
)
PROCESS_ID = flags.DEFINE_integer(
  'process_id',
  None,
  'Several hosts: this process\'s index, from 0. Default: JAX_PROCESS_ID, a Kubernetes indexed '
  'job\'s JOB_COMPLETION_INDEX, or SLURM\'s.',
  lower_bound=0,
)
