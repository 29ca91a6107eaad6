"""Initial representations: method of moments (FedRep Algorithm 2) or random."""

import jax
import jax.numpy as jnp

from fedjax_rep.linear.problem import orthonormal


def method_of_moments(X: jax.Array, y: jax.Array, rep_dim: int) -> jax.Array:
  """Top-k eigenvectors [d, k] of (1/n) sum_i Z_i, Z_i = (1/m) sum_j y_ij^2 x_ij x_ij^T.

  X [n, m, d], y [n, m]. Computed as one [d, n*m] x [n*m, d] product.
  """
  d = X.shape[-1]
  flat_x = X.reshape(-1, d)
  moments = flat_x.T @ (flat_x * y.reshape(-1, 1) ** 2) / flat_x.shape[0]
  return jnp.linalg.eigh(moments)[1][:, ::-1][:, :rep_dim]


METHODS = ("moments", "random", "random-scaled")


def init_representation(key: jax.Array, data, rep_dim: int, method: str, lr=None) -> jax.Array:
  """B0 [d, k]: 'moments' uses one batch from every client of `data`; 'random' is a random
  orthonormal matrix; 'random-scaled' is that divided by sqrt(lr), so that sqrt(lr) B0 is
  orthonormal (FedAvg-FT Theorem 1: ||I - lr B0^T B0|| = 0)."""
  if method == "moments":
    X, y = data.batch(key, jnp.arange(data.num_clients))
    return method_of_moments(X, y, rep_dim)
  if method == "random":
    return orthonormal(key, data.dim, rep_dim)
  if method == "random-scaled":
    return orthonormal(key, data.dim, rep_dim) / jnp.sqrt(lr)
  raise ValueError(f"init must be one of {METHODS}, got {method!r}")
