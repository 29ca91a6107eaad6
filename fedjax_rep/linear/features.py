"""Clients' features Z_i = A_i M in the k-major layout that the linear rounds use.

The c clients' samples A [c, m, p] of a block are multiplied by M [p, k] as one
[k, p] x [p, c m] product on A's rows [c m, p]. Its output [k, c m] is k-major, which
XLA:CPU's YNNPACK dots run much faster than [c m, k] (see docs/benchmarks.md), and a
program that multiplies the same rows again (a FedRep round's gradient, the labels of a
fresh draw) has XLA read or generate them once. For samples read from memory (fixed
datasets) the row-major product with M's columns padded to a full vector register is
faster (`k_major(..., row_major=True)`).
"""

import jax
import jax.numpy as jnp

LANES = 8  # float32 lanes of a 256-bit vector register


def k_major(A: jax.Array, M: jax.Array, row_major: bool = False) -> jax.Array:
  """Z^T [k, c, m]: the features Z_i = A_i M of A [c, m, p] and M [p, k], k-major.

  row_major=False: one [k, p] x [p, c m] product. row_major=True: the product
  [c m, p] x [p, k'] with M's columns zero-padded to k' (a multiple of LANES), then
  transposed; on CPU the FedRep round on fixed data (A read from memory) runs faster so
  (see docs/benchmarks.md), while products that generate A (fresh samples) keep the
  k-major product that their label draw shares. Both give the same numbers up to
  float32 round-off.
  """
  c, m, p = A.shape
  k = M.shape[1]
  rows = A.reshape(c * m, p)
  if not row_major:
    return jax.lax.dot_general(M.T, rows, (((1,), (1,)), ((), ()))).reshape(k, c, m)
  padded = jnp.pad(M, ((0, 0), (0, -k % LANES)))
  return jnp.moveaxis((rows @ padded)[:, :k].reshape(c, m, k), -1, 0)


def apply_heads(Zt: jax.Array, heads: jax.Array) -> jax.Array:
  """Z_i w_i [c, m] of Z^T [k, c, m] (`k_major`) and the heads w [c, k]."""
  return sum(Zt[j] * heads[:, j, None] for j in range(Zt.shape[0]))
