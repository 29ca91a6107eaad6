"""Metrics of linear representation learning."""

import jax
import jax.numpy as jnp


def principal_angle(B: jax.Array, B_star: jax.Array) -> jax.Array:
  """dist(B, B*) = ||(I - Q Q^T) Q*||_2: the sine of the largest principal angle (not squared).

  Q, Q* are orthonormal bases of col(B) and col(B*).

  Args:
    B: the representation [d, k].
    B_star: the ground truth [d, k*].

  Returns:
    The distance [], in [0, 1].
  """
  Q = jnp.linalg.qr(B)[0]
  Q_star = jnp.linalg.qr(B_star)[0]
  residual = Q_star - Q @ (Q.T @ Q_star)
  return jnp.linalg.svd(residual, compute_uv=False)[0]


def mean_squared_error(theta: jax.Array, X: jax.Array, y: jax.Array,
                       counts: jax.Array | None = None) -> jax.Array:
  """The mean squared error (x^T theta_i - y)^2 of the clients' linear models.

  The mean is over clients and samples; with `counts`, the mean over the clients with
  counts[i] > 0 of each one's mean over its first counts[i] samples (a client without
  samples is left out; NaN if none has any).

  Args:
    theta: the clients' models [n, d].
    X: their samples [n, m, d].
    y: their labels [n, m].
    counts: [n] int, the real samples of each client (the rest padding), or None (all m).

  Returns:
    The mean squared error [].
  """
  squared = (jnp.einsum("nmd,nd->nm", X, theta) - y) ** 2
  if counts is None:
    return jnp.mean(squared)
  real = jnp.arange(X.shape[1]) < counts[:, None]
  per_client = jnp.sum(jnp.where(real, squared, 0.0), axis=1) / jnp.maximum(counts, 1)
  tested = counts > 0
  return jnp.sum(jnp.where(tested, per_client, 0.0)) / jnp.sum(tested)


def model_error(theta: jax.Array, models: jax.Array) -> jax.Array:
  """Mean model error (1/n) sum_i ||theta_i - theta_i*|| (norms, not squared).

  Args:
    theta: the clients' models [n, d].
    models: the ground-truth models theta* [n, d].

  Returns:
    The mean error [].
  """
  return jnp.mean(jnp.linalg.norm(theta - models, axis=-1))


def round_metrics(B, theta_fn, data, train_loss):
  """train_loss, principal_angle where the data has B*, and the data's own model metrics
  (`model_metrics`: test_error / model_error). theta_fn() gives the personal models [n, d]."""
  metrics = {"train_loss": train_loss}
  if data.B_star is not None:
    metrics["principal_angle"] = principal_angle(B, data.B_star)
  return {**metrics, **data.model_metrics(theta_fn)}
