"""Ground truth of linear shared-representation problems, and samples drawn from it.

FedRep (Section 4): y = x^T B* w_i* + noise, with B* [d, k] orthonormal, ||w_i*|| = sqrt(k),
x ~ N(0, I_d), noise ~ N(0, noise_std^2). The data that runs train on (fixed, fresh or
population) are in `data_modes`; their checks in `validation`.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import checks
from fedjax_rep.core import struct
from fedjax_rep.linear import features
from fedjax_rep.core import normals


@struct.dataclass
class LinearProblem:
  """Ground truth of a linear shared-representation problem.

  Attributes:
    B_star: [dim, rep_dim] float array with orthonormal columns, the shared representation B*.
    W_star: [clients, rep_dim] float array, the clients' heads w_i*.
    noise_std: scalar float array, the standard deviation of the label noise.
  """
  B_star: jax.Array
  W_star: jax.Array
  noise_std: jax.Array

  @property
  def num_clients(self) -> int:
    return self.W_star.shape[0]

  def check_layout(self) -> None:
    """Raises ValueError unless B_star is [d, k*] and W_star [n, k*] with n, d, k* >= 1 and
    noise_std is a scalar (shapes only: also inside a trace)."""
    B_star, W_star = self.B_star, self.W_star
    if (len(B_star.shape) != 2 or len(W_star.shape) != 2 or B_star.shape[1] != W_star.shape[1]
        or min(B_star.shape) < 1 or len(jnp.shape(self.noise_std))):
      raise ValueError(f"the problem must have B_star [dim, k*] and W_star [clients, k*] (dim, "
                       f"k* >= 1) and a scalar noise_std; got {tuple(B_star.shape)}, "
                       f"{tuple(W_star.shape)} and {tuple(jnp.shape(self.noise_std))}")
    checks.in_range("num_clients (W_star.shape[0])", W_star.shape[0], 1,
                    advice="the problem needs at least one client")


def check_noise_std(noise_std) -> None:
  """Raises ValueError unless noise_std is a finite number >= 0 (where concrete)."""
  noise_std = checks.host(noise_std)
  checks.finite("noise_std", noise_std, advice="it must be a finite number >= 0")
  if checks.concrete(noise_std) and np.any(noise_std < 0):
    raise ValueError(f"noise_std = {noise_std} is out of range: it must be >= 0")


def random_heads(key: jax.Array, num_clients: int, rep_dim: int) -> jax.Array:
  """Gaussian heads [n, k] rescaled to norm sqrt(k) (FedRep Assumption 3)."""
  w = jax.random.normal(key, (num_clients, rep_dim))
  return w * jnp.sqrt(rep_dim) / jnp.linalg.norm(w, axis=-1, keepdims=True)


def orthonormal(key: jax.Array, dim: int, rep_dim: int) -> jax.Array:
  """A random d x k matrix with orthonormal columns (QR of a Gaussian matrix)."""
  return jnp.linalg.qr(jax.random.normal(key, (dim, rep_dim)))[0]


def make_problem(key: jax.Array, num_clients: int, dim: int, rep_dim: int,
                 noise_std: float, normalize_heads: bool = True) -> LinearProblem:
  """Draws a ground truth: an orthonormal B* and Gaussian heads W*.

  Args:
    key: PRNG key.
    num_clients: number of clients n.
    dim: data dimension d.
    rep_dim: representation dimension k.
    noise_std: standard deviation of the label noise.
    normalize_heads: rescale each head to norm sqrt(k) (FedRep); False keeps plain N(0, 1)
      entries (FedAvg-FT).

  Returns:
    A `LinearProblem`: B_star [d, k] and W_star [n, k] float arrays, noise_std a float32
    scalar.

  Raises:
    ValueError: n, d or k not an integer >= 1, k > d, noise_std not a finite number >= 0
      (where concrete).
  """
  checks.positive_ints("make_problem", num_clients=num_clients, dim=dim, rep_dim=rep_dim)
  checks.in_range("rep_dim", rep_dim, 1, dim, "dim", "choose rep_dim <= dim")
  check_noise_std(noise_std)
  key_b, key_w = jax.random.split(key)
  heads = (random_heads(key_w, num_clients, rep_dim) if normalize_heads
           else jax.random.normal(key_w, (num_clients, rep_dim)))
  return LinearProblem(B_star=orthonormal(key_b, dim, rep_dim), W_star=heads,
                       noise_std=jnp.asarray(noise_std, jnp.float32))


def sample(key: jax.Array, B_star: jax.Array, heads: jax.Array, noise_std, num_samples: int,
           ids: jax.Array | None = None):
  """Samples y = x^T B_star head + noise_std * N(0, 1), x ~ N(0, I_d), for c clients.

  Client j's samples are seeded by fold_in(key, ids[j]), so they do not depend on the other
  clients; the normals are jax.random.normal's, bit for bit (`normals.normal`). The
  noiseless labels are one product over all c clients (`features`).

  Args:
    key: PRNG key.
    B_star: [dim, rep_dim] float array, the ground-truth representation.
    heads: [clients, rep_dim] float array, the clients' ground-truth heads.
    noise_std: scalar, the standard deviation of the label noise.
    num_samples: number of samples m per client.
    ids: [clients] int array, the ids that seed the clients' samples (None: 0..c-1).

  Returns:
    (X, y): X [clients, num_samples, dim] and y [clients, num_samples] float arrays.
  """
  ids = jnp.arange(heads.shape[0]) if ids is None else ids
  dim = B_star.shape[0]

  def one(client_id):
    key_x, key_e = jax.random.split(jax.random.fold_in(key, client_id))
    return normals.normal(key_x, (num_samples, dim)), normals.normal(key_e, (num_samples,))

  X, noise = jax.vmap(one)(ids)
  return X, features.apply_heads(features.k_major(X, B_star), heads) + noise_std * noise


def sample_clients(key: jax.Array, problem: LinearProblem, clients: jax.Array, num_samples: int):
  """Draws fresh samples of some of `problem`'s clients (`sample` with their heads).

  Args:
    key: PRNG key.
    problem: the ground truth.
    clients: [c] int array, the clients' indices; they also seed their samples.
    num_samples: number of samples m per client.

  Returns:
    (X, y): X [c, num_samples, dim] and y [c, num_samples] float arrays.
  """
  return sample(key, problem.B_star, problem.W_star[clients], problem.noise_std, num_samples,
                ids=clients)
