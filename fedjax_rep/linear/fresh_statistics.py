"""Exact sampling of a FedRep round's fresh data through the statistics the round uses.

For x ~ N(0, I_d) a FedRep / GD-GD round uses client i's samples X_i [m, d] only through
X_i B, y_i = X_i B* w_i* + e_i and X_i^T r_i (r_i the residual). With Q [d, p] an
orthonormal basis containing span[B, B*] (p = 2k) and P = I - Q Q^T:
  A_i = X_i Q [m, p] has i.i.d. N(0, 1) entries, X_i B = A_i (Q^T B),
  y_i = A_i (Q^T B*) w_i* + e_i,   X_i^T r_i = Q A_i^T r_i + P X_i^T r_i,
and given A_i, e_i, P X_i^T r_i is distributed as ||r_i|| P g_i, g_i ~ N(0, I_d)
independent. Over the clients, sum_i c_i ||r_i|| P g_i w_i^T is distributed as P H L^T
with H [d, k] standard normal and L L^T = S = sum_i c_i^2 ||r_i||^2 w_i w_i^T [k, k].
So a client needs m (p + 1) normals instead of m (d + 1), its work runs in p dimensions,
and one draw H per round completes the gradient (whatever the blocks or devices).
"""

import jax
import jax.numpy as jnp

from fedjax_rep.linear import features
from fedjax_rep.core import normals

VECTOR = 16  # float32 lanes of a 512-bit vector register


def householder_basis(M: jax.Array) -> jax.Array:
  """Q [d, p]: orthonormal columns with span(M) contained in span(Q), for M [d, p] (p <= d).

  Householder QR written in jnp (no LAPACK): Q = H_1 ... H_p I[:, :p]. A column that is
  already in the span of the previous ones (M rank-deficient, e.g. B = B*) gets the
  identity reflector, so Q stays orthonormal and M = Q R still holds.
  """
  d, p = M.shape
  rows = jnp.arange(d)
  reflectors = []
  R = M
  for j in range(p):
    x = jnp.where(rows >= j, R[:, j], 0.0)
    x = x / jnp.maximum(jnp.max(jnp.abs(x)), jnp.finfo(M.dtype).tiny)  # no under/overflow
    v = x.at[j].add(jnp.where(x[j] >= 0, 1.0, -1.0) * jnp.linalg.norm(x))
    norm = jnp.linalg.norm(v)
    u = jnp.where(norm > 0, v / jnp.where(norm > 0, norm, 1.0), 0.0)  # 0: identity
    R = R - 2.0 * jnp.outer(u, u @ R)
    reflectors.append(u)
  Q = jnp.eye(d, p, dtype=M.dtype)
  for u in reversed(reflectors):
    Q = Q - 2.0 * jnp.outer(u, u @ Q)
  return Q


def cholesky_psd(S: jax.Array) -> jax.Array:
  """Lower-triangular L [k, k] with L L^T = S for symmetric positive semi-definite S.

  Unrolled Cholesky (k is small) whose pivots at round-off level (<= k eps max diag S) or
  below are set to 0 with their column: S = 0 gives L = 0 (e.g. GD-GD's first round, all
  heads zero), and a rank-deficient S its exact-rank factor up to round-off.
  """
  k = S.shape[-1]
  tol = k * jnp.finfo(S.dtype).eps * jnp.max(jnp.diagonal(S))  # round-off level of a pivot
  L = [[jnp.zeros((), S.dtype)] * k for _ in range(k)]
  for j in range(k):
    pivot = S[j, j] - sum(L[j][q] ** 2 for q in range(j))
    positive = pivot > tol
    diag = jnp.sqrt(jnp.where(positive, pivot, 1.0))
    L[j][j] = jnp.where(positive, diag, 0.0)
    for i in range(j + 1, k):
      L[i][j] = jnp.where(positive, (S[i, j] - sum(L[i][q] * L[j][q] for q in range(j))) / diag,
                          0.0)
  return jnp.stack([jnp.stack(row) for row in L])


def basis(B: jax.Array, B_star: jax.Array) -> jax.Array:
  """Q [d, 2k]: the round's orthonormal basis containing span[B, B*] (B, B* [d, k])."""
  return householder_basis(jnp.concatenate([B, B_star], axis=1))


def sample(key: jax.Array, coords_star: jax.Array, heads: jax.Array, noise_std,
           num_samples: int, ids: jax.Array):
  """A [c, m, p] i.i.d. N(0, 1) and y [c, m] = A coords_star head + noise_std N(0, 1) of c
  clients with ground-truth heads `heads` [c, k]; coords_star = Q^T B* [p, k].

  Client j's m (p + 1) normals (A row-major, then the noise) are the first of one flat
  draw (`normals.normal_pairs`: two normals per hash) of m (p + 1) rounded up to a multiple
  of VECTOR, seeded by fold_in(key, ids[j]): whole CPU vectors make the generator faster
  per normal than a ragged length (see docs/benchmarks.md). The labels are one product
  over all clients' rows (`features`).
  """
  p = coords_star.shape[0]
  size = num_samples * (p + 1)
  padded = -(-size // VECTOR) * VECTOR
  drawn = jax.vmap(lambda i: normals.normal_pairs(jax.random.fold_in(key, i), padded))(ids)
  A = drawn[:, :num_samples * p].reshape(ids.shape[0], num_samples, p)
  labels = features.apply_heads(features.k_major(A, coords_star), heads)
  return A, labels + noise_std * drawn[:, num_samples * p:size]


def residual_statistic(weights: jax.Array, scaled_residual: jax.Array, w: jax.Array):
  """S = sum_i weights_i^2 ||scaled_residual_i||^2 w_i w_i^T [k, k]; scaled_residual [c, m]
  is r_i / m_i, w [c, k]: the covariance factor of the gradient's part outside span(Q)."""
  scale = weights ** 2 * jnp.sum(scaled_residual ** 2, axis=1)
  return jnp.einsum("c,ck,cl->kl", scale, w, w)


def outside_gradient(key: jax.Array, Q: jax.Array, S: jax.Array) -> jax.Array:
  """P H L^T [d, k]: a draw of the clients' summed gradient outside span(Q) [d, p], with
  H [d, k] ~ N(0, 1) from `key`, L L^T = S [k, k], P = I - Q Q^T."""
  H = jax.random.normal(key, (Q.shape[0], S.shape[0]), Q.dtype)
  H = H - Q @ (Q.T @ H)
  return H @ cholesky_psd(S).T
