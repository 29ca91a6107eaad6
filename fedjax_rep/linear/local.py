"""Local-only training and the error of new clients that fit only a head."""

import jax

from fedjax_rep.linear.heads import fit_models
from fedjax_rep.linear.metrics import mean_squared_error
from fedjax_rep.linear.problem import random_heads, sample


def local_models(X: jax.Array, y: jax.Array) -> jax.Array:
  """theta_i [n, d]: each client's least-squares fit in R^d on its own X_i [m, d], y_i [m]
  (minimum-norm when m < d; see `heads.least_squares`)."""
  return fit_models(X, y)


def new_client_error(key: jax.Array, B: jax.Array | None, B_star: jax.Array, noise_std,
                     num_samples: int, num_clients: int = 100, test_samples: int = 500):
  """Test MSE of new clients that fit only a head on a learned representation.

  `num_clients` new clients with ground-truth heads of norm sqrt(k) each get `num_samples`
  (m_new) samples, fit w by least squares on X B, and are tested on `test_samples` fresh
  samples. B [d, k'] is the learned representation; B=None fits in R^d (local only).
  Returns the mean squared error over clients and test samples (noise included).
  """
  key_heads, key_train, key_test = jax.random.split(key, 3)
  true_heads = random_heads(key_heads, num_clients, B_star.shape[1])
  X, y = sample(key_train, B_star, true_heads, noise_std, num_samples)
  X_test, y_test = sample(key_test, B_star, true_heads, noise_std, test_samples)
  return mean_squared_error(fit_models(X, y, B), X_test, y_test)
