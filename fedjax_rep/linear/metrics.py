"""Metrics of linear representation learning."""

import jax
import jax.numpy as jnp


def principal_angle(B: jax.Array, B_star: jax.Array) -> jax.Array:
  """dist(B, B*) = ||(I - Q Q^T) Q*||_2: the sine of the largest principal angle (not squared).

  Q, Q* are orthonormal bases of col(B) [d, k] and col(B*) [d, k*].
  """
  Q = jnp.linalg.qr(B)[0]
  Q_star = jnp.linalg.qr(B_star)[0]
  residual = Q_star - Q @ (Q.T @ Q_star)
  return jnp.linalg.svd(residual, compute_uv=False)[0]


def mean_squared_error(theta: jax.Array, X: jax.Array, y: jax.Array) -> jax.Array:
  """Mean over clients and samples of (x^T theta_i - y)^2; theta [n, d], X [n, m, d], y [n, m]."""
  return jnp.mean((jnp.einsum("nmd,nd->nm", X, theta) - y) ** 2)
