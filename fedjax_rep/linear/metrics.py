"""Metrics of linear representation learning."""

import jax
import jax.numpy as jnp

from fedjax_rep.linear.problem import FixedData


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


def model_error(theta: jax.Array, models: jax.Array) -> jax.Array:
  """(1/n) sum_i ||theta_i - theta_i*|| (norms, not squared) for theta, models [n, d]."""
  return jnp.mean(jnp.linalg.norm(theta - models, axis=-1))


def round_metrics(B, theta_fn, data, train_loss):
  """train_loss, and principal_angle / test_error / model_error where the data has B* / a
  test set / ground-truth models. theta_fn() gives the personal models [n, d]."""
  metrics = {"train_loss": train_loss}
  if data.B_star is not None:
    metrics["principal_angle"] = principal_angle(B, data.B_star)
  if isinstance(data, FixedData):
    theta = theta_fn() if data.X_test is not None or data.models is not None else None
    if data.X_test is not None:
      metrics["test_error"] = mean_squared_error(theta, data.X_test, data.y_test)
    if data.models is not None:
      metrics["model_error"] = model_error(theta, data.models)
  return metrics
