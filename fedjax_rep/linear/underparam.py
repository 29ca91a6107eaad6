"""Under-parameterised problems (FLUTE, Section 4 and App. C.1): no rank-k model fits all.

Client i's ground-truth model is phi_i [d], the i-th column of Phi = U Lambda V^T (d x M);
we store Phi^T as `models` [M, d] (client-major). When rank(Phi) > k no (B, W) gives
B w_i = phi_i for every client; the best one can do is the rank-k truncation of Phi.
"""

import jax
import jax.numpy as jnp

from fedjax_rep.core import checks
from fedjax_rep.linear.data_modes import FixedData
from fedjax_rep.linear.metrics import model_error
from fedjax_rep.linear.problem import check_noise_std, orthonormal, sample

SPECTRA = ("linear", "geometric", "gaussian")


def spectrum(dim: int, kind: str = "linear", ratio: float = 0.7) -> jax.Array:
  """Singular values of Phi.

  'linear': lambda_i = 2d - i + 1 (FLUTE App. C.1, i = 1..d); 'geometric':
  lambda_i = 2d ratio^(i-1) (same top value, decaying by `ratio`).

  Args:
    dim: d.
    kind: 'linear' or 'geometric'.
    ratio: the decay of 'geometric'.

  Returns:
    lambda [d] (float32).

  Raises:
    ValueError: an unknown kind.
  """
  i = jnp.arange(dim, dtype=jnp.float32)
  if kind == "linear":
    return 2.0 * dim - i
  if kind == "geometric":
    return 2.0 * dim * ratio ** i
  raise ValueError(f"spectrum must be 'linear' or 'geometric', got {kind!r}")


def make_models(key: jax.Array, num_clients: int, dim: int, kind: str = "linear",
                ratio: float = 0.7) -> jax.Array:
  """Ground-truth models of an under-parameterised problem.

  'linear' / 'geometric': Phi = U Lambda V^T with U [d, r], V [M, r] random orthonormal,
  r = min(d, M) and Lambda the first r values of `spectrum` (App. C.1).
  'gaussian': phi_i ~ N(0, I_d) i.i.d. (FLUTE Section 7.1, Fig. 1).

  Args:
    key: the PRNG key.
    num_clients: M.
    dim: d.
    kind: one of SPECTRA ('linear', 'geometric', 'gaussian').
    ratio: the decay of 'geometric' (`spectrum`).

  Returns:
    models [M, d]: the rows phi_i^T of Phi^T.

  Raises:
    ValueError: M or d not an integer >= 1, an unknown kind.
  """
  checks.positive_ints("make_models", num_clients=num_clients, dim=dim)
  if kind not in SPECTRA:
    raise ValueError(f"spectrum must be one of {SPECTRA}, got {kind!r}")
  if kind == "gaussian":
    return jax.random.normal(key, (num_clients, dim))
  rank = min(dim, num_clients)
  key_u, key_v = jax.random.split(key)
  U, V = orthonormal(key_u, dim, rank), orthonormal(key_v, num_clients, rank)
  return (V * spectrum(dim, kind, ratio)[:rank]) @ U.T


def top_subspace(models: jax.Array, rep_dim: int) -> jax.Array:
  """The top-k left singular vectors of Phi (= the right ones of `models`).

  Args:
    models: Phi^T [M, d].
    rep_dim: k.

  Returns:
    B* [d, k], orthonormal.
  """
  return jnp.linalg.svd(models, full_matrices=False)[2][:rep_dim].T


def rank_k_error(models: jax.Array, rep_dim: int) -> jax.Array:
  """The floor (1/M) sum_i ||(Phi_k)_i - phi_i|| of `model_error`.

  Phi_k is the best rank-k approximation of Phi (truncated SVD). Phi_k minimises the sum
  of squared norms; for this mean of norms it is the reference level the paper's plots use.

  Args:
    models: Phi^T [M, d].
    rep_dim: k.

  Returns:
    The error [].
  """
  U, s, Vt = jnp.linalg.svd(models, full_matrices=False)
  return model_error((U[:, :rep_dim] * s[:rep_dim]) @ Vt[:rep_dim], models)


def make_data(key: jax.Array, models: jax.Array, rep_dim: int | None, samples: int, noise_std,
              pad_to: int | None = None) -> FixedData:
  """Fixed local datasets of `samples` (N) per client: y = x^T phi_i + noise, x ~ N(0, I_d).

  Args:
    key: the PRNG key of the samples.
    models: Phi^T [M, d].
    rep_dim: k of `B_star`; None leaves B_star None, to be set later with `top_subspace`.
    samples: N, the real samples per client.
    noise_std: the label noise's standard deviation.
    pad_to: rows per client; pad_to > samples zero-pads every client to pad_to rows, so
      that datasets of different N share one shape (and pytree structure: one vmapped
      program runs them all). Default: samples.

  Returns:
    FixedData with X [M, R, d], y [M, R] (R = pad_to or N), `B_star` the top-k subspace of
    Phi [d, k] (for `principal_angle`), `models` Phi^T [M, d] (for `model_error`) and
    `counts` N for every client (int32 [M]).

  Raises:
    ValueError: models not [M, d] with M, d >= 1; rep_dim not None or an integer in [1, d];
      samples not an integer >= 1; pad_to not None or an integer >= samples; noise_std not
      a finite number >= 0 (where concrete).
  """
  if len(jnp.shape(models)) != 2 or min(jnp.shape(models)) < 1:
    raise ValueError(f"make_data: models must be [clients >= 1, dim >= 1] (Phi^T, e.g. from "
                     f"make_models); got shape {jnp.shape(models)}")
  num_clients, dim = models.shape
  checks.positive_ints("make_data", samples=samples)
  if rep_dim is not None:
    checks.positive_ints("make_data", rep_dim=rep_dim)
    checks.in_range("rep_dim", rep_dim, 1, dim, "dim, models.shape[1]", "choose a smaller rep_dim")
  if pad_to is not None:
    checks.positive_ints("make_data", pad_to=pad_to)
    checks.in_range("pad_to", pad_to, samples, advice="pad to at least the samples per client")
  check_noise_std(noise_std)
  rows = pad_to or samples
  X, y = sample(key, jnp.eye(dim), models, noise_std, rows)
  real = jnp.arange(rows) < samples
  X, y = jnp.where(real[:, None], X, 0.0), jnp.where(real, y, 0.0)
  counts = jnp.full((num_clients,), samples, jnp.int32)
  B_star = None if rep_dim is None else top_subspace(models, rep_dim)
  return FixedData(X=X, y=y, B_star=B_star, counts=counts,
                   models=models)
