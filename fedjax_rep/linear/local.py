"""Local-only training and the error of new clients that fit only a head."""


import jax
import jax.numpy as jnp

from fedjax_rep.linear.fedavg import check_model, fine_tuned_models
from fedjax_rep.linear.heads import fit_models
from fedjax_rep.linear.metrics import mean_squared_error
from fedjax_rep.linear.problem import random_heads, sample


def local_models(X: jax.Array, y: jax.Array) -> jax.Array:
  """Local-only models: each client's least-squares fit in R^d on its own data.

  Minimum-norm when m < d (see `heads.least_squares`).

  Args:
    X: the clients' samples [n, m, d].
    y: their labels [n, m].

  Returns:
    theta [n, d].
  """
  return fit_models(X, y)


@jax.jit(static_argnames=("sample_counts", "num_clients", "test_samples"))
def new_client_error(key: jax.Array, B: jax.Array | None, B_star: jax.Array, noise_std,
                     sample_counts: tuple[int, ...], num_clients: int = 100,
                     test_samples: int = 500) -> jax.Array:
  """Test MSE of new clients that fit only a head on a learned B.

  `num_clients` new clients with ground-truth heads of norm sqrt(k) each draw
  max(sample_counts) samples; for each m_new in `sample_counts` they fit w by least squares
  on their first m_new samples projected by B (minimum-norm when m_new < k) and are tested
  on `test_samples` fresh samples. The same clients and samples serve every m_new and
  every B.

  Args:
    key: the PRNG key of the new clients' heads and samples.
    B: the learned representation [d, k']; None fits in R^d (local only).
    B_star: the ground-truth representation [d, k].
    noise_std: the label noise's standard deviation.
    sample_counts: the training samples m_new to evaluate (a tuple: static).
    num_clients: the number of new clients (static).
    test_samples: test samples per new client (static).

  Returns:
    The errors [len(sample_counts)]: mean squared errors over clients and test samples
    (noise included).
  """
  if B is not None:
    check_model(B, None, B_star.shape[0])
  key_heads, key_train, key_test = jax.random.split(key, 3)
  true_heads = random_heads(key_heads, num_clients, B_star.shape[1])
  X, y = sample(key_train, B_star, true_heads, noise_std, max(sample_counts))
  X_test, y_test = sample(key_test, B_star, true_heads, noise_std, test_samples)
  return jnp.stack([mean_squared_error(fit_models(X[:, :m], y[:, :m], B), X_test, y_test)
                    for m in sample_counts])


@jax.jit(static_argnames=("sample_counts", "num_clients", "steps", "train_body"))
def fine_tune_error(key: jax.Array, B: jax.Array, w: jax.Array, B_star: jax.Array, noise_std,
                    lr, sample_counts: tuple[int, ...], num_clients: int = 100,
                    steps: int = 200, train_body: bool = True) -> jax.Array:
  """Model error of new clients that fine-tune a global model (B, w) (FedAvg-FT Fig. 3).

  The error is that of the figure's right panel.

  `num_clients` new clients with N(0, I_k) ground-truth heads w* each draw max(sample_counts)
  samples (x ~ N(0, I_d)); for each n in `sample_counts` they run `steps` full-batch GD
  steps on both B and w (or w only) over their first n samples, from (B, w).

  Args:
    key: the PRNG key of the new clients' heads and samples.
    B: the global representation [d, k].
    w: the global head [k].
    B_star: the ground-truth representation [d, k*].
    noise_std: the label noise's standard deviation.
    lr: the fine-tuning step size.
    sample_counts: the training samples n to evaluate (a tuple: static).
    num_clients: the number of new clients (static).
    steps: GD steps of the fine-tuning (static).
    train_body: fine-tune B and w; False: w only (static).

  Returns:
    The errors [len(sample_counts)]: the mean over clients of ||B' w' - B* w*||^2.
  """
  check_model(B, w, B_star.shape[0])
  key_heads, key_train = jax.random.split(key)
  true_heads = jax.random.normal(key_heads, (num_clients, B_star.shape[1]))
  X, y = sample(key_train, B_star, true_heads, noise_std, max(sample_counts))
  targets = true_heads @ B_star.T
  return jnp.stack([
      jnp.mean(jnp.sum((fine_tuned_models(B, w, (X[:, :n], y[:, :n]), lr, steps, train_body)
                        - targets) ** 2, axis=-1)) for n in sample_counts])
