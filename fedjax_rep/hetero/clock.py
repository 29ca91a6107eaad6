"""Virtual wall clock of synchronous rounds: time is simulated, nothing sleeps.

A round lasts as long as its slowest participant's local work, plus the communication cost
C of sending the model out and back: max_{i: mask_i} (time_i * local_updates) + C.
"""

import jax
import jax.numpy as jnp
import numpy as np


def _check_comm_cost(comm_cost):
  if not isinstance(comm_cost, jax.core.Tracer) and not np.all(np.asarray(comm_cost) >= 0):
    raise ValueError(f"comm_cost must be >= 0; got {comm_cost!r}")


def round_duration(times: jax.Array, mask: jax.Array, local_updates, comm_cost) -> jax.Array:
  """Duration [...] of rounds with times per local update [..., c] (>= 0) of the clients and
  participation mask [..., c] (bool). With no participant the compute part is 0."""
  _check_comm_cost(comm_cost)
  return jnp.max(jnp.where(mask, times, 0.0), axis=-1) * local_updates + comm_cost


def wall_clock(times: jax.Array, mask: jax.Array, local_updates, comm_cost) -> jax.Array:
  """Elapsed time [..., T] at the end of each of T rounds, from times and mask [..., T, c]."""
  return jnp.cumsum(round_duration(times, mask, local_updates, comm_cost), axis=-1)
