"""Initial representations: method of moments (FedRep Algorithm 2) or random."""

import jax
import jax.numpy as jnp

from fedjax_rep.core import sharding
from fedjax_rep.linear import blocks
from fedjax_rep.linear.problem import orthonormal


def method_of_moments(X: jax.Array, y: jax.Array, rep_dim: int,
                      counts: jax.Array | None = None) -> jax.Array:
  """Top-k eigenvectors of (1/n) sum_i Z_i, Z_i = (1/m_i) sum_j y_ij^2 x_ij x_ij^T.

  The moment matrix is computed as one [d, n*m] x [n*m, d] product.

  Args:
    X: the clients' samples [n, m, d] (zero padding rows).
    y: their labels [n, m].
    rep_dim: k, the number of eigenvectors.
    counts: m_i, the real samples [n] of each client; default m.

  Returns:
    B0 [d, k].
  """
  n, m, d = X.shape
  weights = y ** 2 if counts is None else y ** 2 * (m / counts)[:, None]
  flat_x = X.reshape(-1, d)
  moments = flat_x.T @ (flat_x * weights.reshape(-1, 1)) / (n * m)
  return top_eigenvectors(moments, rep_dim)


def top_eigenvectors(moments: jax.Array, rep_dim: int) -> jax.Array:
  """The eigenvectors [d, k] of the k largest eigenvalues of symmetric `moments` [d, d]."""
  return jnp.linalg.eigh(moments)[1][:, ::-1][:, :rep_dim]


def moment_matrix(key: jax.Array, data, block: int | None = None,
                  devices: int | None = None) -> jax.Array:
  """(1/n) sum_i (1/m_i) sum_j y_ij^2 x_ij x_ij^T [d, d] over one batch of every client.

  Streamed over blocks of `block` clients (None: sized to the cache, `blocks.block_size`)
  and, with `devices` > 1, over the devices' shards of the clients: memory O(block), never
  O(n m d). Fresh data draw the same samples as `data.batch(key, arange(n))`.
  """
  n_total, m, d = data.num_clients, data.samples, data.dim

  def on_device(index, data, shared):
    del shared
    n = data.num_clients

    def one_block(start, size, parts):
      del parts
      clients = start + jnp.arange(size)
      X, y = data.design(key, clients, None, offset=index * n, contiguous=True)
      weights = y ** 2 * (m / data.sample_counts(clients))[:, None]
      flat = X.reshape(-1, d)
      return flat.T @ (flat * weights.reshape(-1, 1)), None

    return blocks.map_blocks(one_block, n, blocks.block_size(n, 4 * m * (d + 1), block))

  sums, _ = sharding.over_clients(on_device, devices, n_total, data, data.client_specs, ())
  return sums / (n_total * m)


def gaussian_scale(dim: int) -> float:
  """FLUTE's initial scale alpha = 1/(10 d) (Theorem 5.1, App. C.1)."""
  return 1.0 / (10 * dim)


METHODS = ("moments", "random", "random-scaled", "gaussian")


def init_representation(key: jax.Array, data, rep_dim: int, method: str, lr=None,
                        block: int | None = None, devices: int | None = None) -> jax.Array:
  """The initial representation B0 by `method`.

  - 'moments': the method of moments on one batch from every client of `data`
    (`moment_matrix`, in blocks of `block` clients over `devices` devices);
  - 'random': a random orthonormal matrix;
  - 'random-scaled': that divided by sqrt(lr), so that sqrt(lr) B0 is orthonormal
    (FedAvg-FT Theorem 1: ||I - lr B0^T B0|| = 0);
  - 'gaussian': i.i.d. N(0, alpha^2) entries with FLUTE's alpha = 1/(10 d).

  Args:
    key: the PRNG key (the moments' batch or the random draw).
    data: the linear data (`num_clients`, `dim`, `batch`; `design` to run in blocks).
    rep_dim: k.
    method: one of METHODS.
    lr: the step size ('random-scaled' only).
    block: clients per block ('moments'); None: sized to the cache (`blocks.block_size`).
    devices: devices to shard the clients over ('moments'); None: one.

  Returns:
    B0 [d, k].

  Raises:
    ValueError: an unknown method.
  """
  if method == "moments":
    if not hasattr(data, "design"):  # data without blocks: all clients at once
      clients = jnp.arange(data.num_clients)
      X, y = data.batch(key, clients)
      return method_of_moments(X, y, rep_dim, data.sample_counts(clients))
    return top_eigenvectors(moment_matrix(key, data, block, devices), rep_dim)
  if method == "gaussian":
    return gaussian_scale(data.dim) * jax.random.normal(key, (data.dim, rep_dim))
  if method == "random":
    return orthonormal(key, data.dim, rep_dim)
  if method == "random-scaled":
    return orthonormal(key, data.dim, rep_dim) / jnp.sqrt(lr)
  raise ValueError(f"init must be one of {METHODS}, got {method!r}")
