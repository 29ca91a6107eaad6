"""Server aggregation: weighted sums over the client axis, divided once at the end.

Every server step (linear and neural) aggregates through these functions, so that a
chunked or sharded client axis is a change here only. A sum is a pair
(sum_i w_i u_i, sum_i w_i); `mean` divides it once.
"""

import jax
import jax.numpy as jnp


def weighted_sum(values, weights: jax.Array):
  """Weighted sum over the leading client axis, and the sum of the weights.

  Args:
    values: a pytree whose leaves are [c, ...] (u_i: client i's rows).
    weights: the client weights w [c], cast to each leaf's dtype.

  Returns:
    (sums, total): sums a pytree like `values` of sum_i w_i u_i, leaves [...]; total the
    scalar sum_i w_i.
  """
  sums = jax.tree.map(lambda u: jnp.tensordot(weights.astype(u.dtype), u, axes=1), values)
  return sums, jnp.sum(weights)


def weighted_einsum(subscripts: str, weights: jax.Array, *operands):
  """(sum_c w_c P_c, sum_c w_c) for the product P_c = einsum(subscripts, *operands) whose
  client axis is labelled 'c' (it must not appear in the output), computed as one fused
  contraction: the per-client products [c, ...] are never formed.

  E.g. 'cmd,cm,ck->dk' sums per-client gradients X_c^T r_c w_c^T [d, k] as one
  [d, c*m] x [c*m, k] product, which XLA:CPU runs much faster than stacking the per-client
  products first (see docs/benchmarks.md).
  """
  inputs, output = subscripts.split("->")
  return jnp.einsum(f"{inputs},c->{output}", *operands, weights), jnp.sum(weights)


def mean(sums, total: jax.Array):
  """sums / total (total clamped away from 0, so an empty cohort gives zeros)."""
  total = jnp.maximum(total, jnp.finfo(jnp.float32).tiny)
  return jax.tree.map(lambda s: s / total.astype(s.dtype), sums)


def weighted_mean(values, weights: jax.Array):
  """Weighted mean sum_i w_i u_i / sum_i w_i over the leading client axis of every leaf.

  Args:
    values: a pytree whose leaves are [c, ...] (u_i: client i's rows).
    weights: the client weights w [c].

  Returns:
    A pytree like `values` with leaves [...]; zeros if the weights sum to 0 (`mean`).
  """
  return mean(*weighted_sum(values, weights))
