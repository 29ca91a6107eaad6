"""Fixed-size client cohorts, sampled uniformly without replacement."""

import jax
import jax.numpy as jnp


def cohort_size(num_clients: int, participation: float) -> int:
  """Number of clients sampled per round: max(1, round(participation * num_clients))."""
  return max(1, round(participation * num_clients))


def sample_cohort(key: jax.Array, num_clients: int, size: int) -> jax.Array:
  """Indices [size] of a cohort drawn uniformly without replacement from range(num_clients).

  The size is static, so every round has the same shape and nothing recompiles.
  With size == num_clients (full participation) the cohort is all clients in order.
  """
  if size == num_clients:
    return jnp.arange(num_clients)
  return jax.random.choice(key, num_clients, (size,), replace=False)
