"""A job of several processes (one per host) under JAX's multi-controller runtime: joining
it from the environment, and which process writes.

Every process runs the same program on the same data; `jax.devices()` then spans every
process's devices, so a client mesh over `devices` > the local devices spans processes,
and the collectives (psum) go between them (gloo on CPU, NCCL on GPU). A process that
stops answering for `heartbeat_seconds()` (FEDJAX_REP_HEARTBEAT_SECONDS, read when a job is
joined) makes the coordination service end the others.
"""

import os
import socket
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

ADDRESS, COUNT, INDEX = "JAX_COORDINATOR_ADDRESS", "NUM_PROCESSES", "PROCESS_ID"
HEARTBEAT = "FEDJAX_REP_HEARTBEAT_SECONDS"  # the variable of `heartbeat_seconds`
DEFAULT_HEARTBEAT_SECONDS = 30
INIT_SECONDS = 120  # how long a process waits for the others to join


class JobError(ValueError):
  """The environment names a job that cannot be joined."""


def job_environment(environ=None) -> dict | None:
  """`jax.distributed.initialize`'s keywords for the job the environment names, or None
  for a single process: JAX_COORDINATOR_ADDRESS (HOST:PORT of process 0), NUM_PROCESSES
  and PROCESS_ID all set; or a Slurm (srun) or Open MPI (mpirun) launch of more than one
  task (SLURM_STEP_NUM_TASKS, OMPI_COMM_WORLD_SIZE), which JAX detects itself ({}).
  JobError for some of the three variables without the others, or values out of range."""
  environ = os.environ if environ is None else environ
  given = [name for name in (ADDRESS, COUNT, INDEX) if environ.get(name)]
  if given:
    missing = [name for name in (ADDRESS, COUNT, INDEX) if name not in given]
    if missing:
      raise JobError(f"{', '.join(given)} set without {', '.join(missing)}: a job of several "
                     f"processes needs all three ({ADDRESS}=HOST:PORT of process 0, "
                     f"{COUNT}=P, {INDEX}=0..P-1); unset them to run one process")
    try:
      count, index = int(environ[COUNT]), int(environ[INDEX])
    except ValueError:
      raise JobError(f"{COUNT}={environ[COUNT]!r} and {INDEX}={environ[INDEX]!r} must be "
                     f"integers") from None
    if count < 1 or not 0 <= index < count:
      raise JobError(f"{COUNT} must be >= 1 and {INDEX} in [0, {COUNT}), got {COUNT}={count}, "
                     f"{INDEX}={index}")
    return {"coordinator_address": environ[ADDRESS], "num_processes": count,
            "process_id": index}
  for name in ("SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE"):  # srun's step, mpirun's
    if environ.get(name, "1").isdigit() and int(environ.get(name, "1")) > 1:
      return {}
  return None


def heartbeat_seconds(environ=None) -> int:
  """The seconds of silence after which a process of a job counts as dead and the others
  stop: FEDJAX_REP_HEARTBEAT_SECONDS of the environment (default os.environ) as it is now,
  DEFAULT_HEARTBEAT_SECONDS (30) where unset or empty. JobError unless an integer >= 1."""
  environ = os.environ if environ is None else environ
  value = environ.get(HEARTBEAT) or str(DEFAULT_HEARTBEAT_SECONDS)
  if not value.strip().isdigit() or int(value) < 1:
    raise JobError(f"{HEARTBEAT}={value!r} must be an integer >= 1 (the seconds of silence "
                   f"after which a process of a job counts as dead); set it to e.g. "
                   f"{DEFAULT_HEARTBEAT_SECONDS}, or unset it for the default "
                   f"{DEFAULT_HEARTBEAT_SECONDS}")
  return int(value)


def free_port() -> int:
  """A TCP port of the loopback interface that nothing listens on now: a coordinator's
  port for a job of local processes (tests, benchmarks)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def join(environ=None) -> bool:
  """Joins the job the environment names (`job_environment`): gloo collectives on CPU, then
  `jax.distributed.initialize` with INIT_SECONDS to gather and `heartbeat_seconds()` of
  silence before a process counts as dead, both read from the environment (default
  os.environ) now. Must come before anything else uses JAX. Returns whether there is a job
  (False: one process, nothing done). JobError, before anything is done, for an environment
  that names no job that can be joined, or a bad FEDJAX_REP_HEARTBEAT_SECONDS."""
  keywords = job_environment(environ)
  if keywords is None:
    return False
  heartbeat = heartbeat_seconds(environ)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**keywords, initialization_timeout=INIT_SECONDS,
                             heartbeat_timeout_seconds=heartbeat)
  return True


def in_job() -> bool:
  """Whether this process is one of a job of several."""
  return jax.process_count() > 1


def is_writer() -> bool:
  """Whether this process writes a run's files: process 0 of a job, or the only process."""
  return jax.process_index() == 0


def warn(message: str) -> None:
  """One line `fedjax-rep: MESSAGE` on stderr, from process 0 of a job (the writer)."""
  if is_writer():
    print(f"fedjax-rep: {message}", file=sys.stderr, flush=True)


def barrier(name: str) -> None:
  """Waits until every process of the job reaches the barrier `name` (nothing for one)."""
  if in_job():
    multihost_utils.sync_global_devices(name)


def leave() -> None:
  """Leaves the job this process joined (nothing for one process): every process waits at
  the coordination service's shutdown barrier, so process 0, which hosts the service, is
  the last to go and no process loses the service while it still polls it."""
  if jax.distributed.is_initialized():
    jax.distributed.shutdown()


def any_process(flag: bool) -> bool:
  """Whether `flag` is True on any process of the job (this process's flag for one)."""
  if not in_job():
    return bool(flag)
  return bool(multihost_utils.process_allgather(np.array(flag, np.int32)).any())
