"""Least-squares heads: batched small normal equations, and head gradient steps.

For larger k it is a column loop in batched XLA ops (no LAPACK call).
Every function takes arrays with any leading batch axes (e.g. [clients, ...]) and is also
safe to `vmap`; called on the whole cohort directly, `least_squares` moves Z to a
[k, m, batch] layout that makes its reductions contiguous (under `vmap` the client axis
stays leading). For k <= UNROLL_MAX the k x k solve is an unrolled Cholesky written in
elementwise ops, which XLA vectorises across the batch: on CPU it is much faster than a
batched LAPACK solve of tiny matrices (see docs/benchmarks.md).
"""

import jax
import jax.numpy as jnp

UNROLL_MAX = 8
RIDGE = 1e-6


def _gram_entries(Z: jax.Array, y: jax.Array | None = None):
  """({(a, b): (Z^T Z)_ab [...] for a <= b}, [(Z^T y)_a [...] for each a] or None) of
  Z [..., m, k], y [..., m].

  Z is moved to [k, m, ...] first, so that every entry is a sum over the leading sample axis
  of contiguous products (vectorised across the batch; a sum over a minor axis of m ~ 10 is
  several times slower on CPU)."""
  cols = jnp.moveaxis(Z, (-1, -2), (0, 1))
  entries = {(a, b): jnp.sum(cols[a] * cols[b], axis=0)
             for a in range(Z.shape[-1]) for b in range(a, Z.shape[-1])}
  if y is None:
    return entries, None
  y_rows = jnp.moveaxis(y, -1, 0)
  return entries, [jnp.sum(col * y_rows, axis=0) for col in cols]


def gram(Z: jax.Array, y: jax.Array | None = None):
  """Z^T Z [..., k, k] of Z [..., m, k] (and Z^T y [..., k] if y [..., m] is given).

  For k <= UNROLL_MAX: k(k+1)/2 fused products of contiguous columns (`_gram_entries`),
  several times faster on CPU than a batched dot over tiny matrices.
  """
  k = Z.shape[-1]
  if k > UNROLL_MAX:
    G = jnp.einsum("...mk,...ml->...kl", Z, Z)
    return G if y is None else (G, jnp.einsum("...mk,...m->...k", Z, y))
  entries, b = _gram_entries(Z, y)
  G = jnp.stack([jnp.stack([entries[min(a, c), max(a, c)] for c in range(k)], -1)
                 for a in range(k)], -2)
  return G if y is None else (G, jnp.stack(b, -1))


def _cholesky_solve_unrolled(A, b):
  """x [..., k] (stacked) solving A x = b, for A given by its entries A[(i, j)] [...] with
  i <= j (symmetric positive definite) and b a list of k arrays [...]."""
  k = len(b)
  L = {}
  for j in range(k):
    L[j, j] = jnp.sqrt(A[j, j] - sum(L[j, p] ** 2 for p in range(j)))
    for i in range(j + 1, k):
      L[i, j] = (A[j, i] - sum(L[i, p] * L[j, p] for p in range(j))) / L[j, j]
  z = {}
  for i in range(k):
    z[i] = (b[i] - sum(L[i, p] * z[p] for p in range(i))) / L[i, i]
  x = {}
  for i in reversed(range(k)):
    x[i] = (z[i] - sum(L[p, i] * x[p] for p in range(i + 1, k))) / L[i, i]
  return jnp.stack([x[i] for i in range(k)], -1)


def _cholesky_solve_loop(A: jax.Array, b: jax.Array) -> jax.Array:
  """Cholesky, then forward and back substitution, one column per `fori_loop` step, all in
  batched XLA ops: no LAPACK call (several LAPACK solves in one program can deadlock the
  2-thread CPU pool of jaxlib 0.10)."""
  k = A.shape[-1]
  index = jnp.arange(k)

  def factor(j, L):
    row = L[..., j, :]  # entries p < j are final, the rest are zero
    diag = jnp.sqrt(A[..., j, j] - jnp.sum(row * row, axis=-1))
    column = (A[..., :, j] - jnp.sum(L * row[..., None, :], axis=-1)) / diag[..., None]
    column = jnp.where(index > j, column, jnp.where(index == j, diag[..., None], 0.0))
    return L.at[..., :, j].set(column)

  L = jax.lax.fori_loop(0, k, factor, jnp.zeros_like(A))

  def forward(i, z):
    return z.at[..., i].set((b[..., i] - jnp.sum(L[..., i, :] * z, axis=-1)) / L[..., i, i])

  z = jax.lax.fori_loop(0, k, forward, jnp.zeros_like(b))

  def backward(step, x):
    i = k - 1 - step
    return x.at[..., i].set((z[..., i] - jnp.sum(L[..., :, i] * x, axis=-1)) / L[..., i, i])

  return jax.lax.fori_loop(0, k, backward, jnp.zeros_like(b))


def solve_spd(A: jax.Array, b: jax.Array) -> jax.Array:
  """x solving A x = b for symmetric positive definite A, by Cholesky.

  For k <= UNROLL_MAX an unrolled Cholesky in elementwise ops; above, a column loop in
  batched XLA ops (no LAPACK call).

  Args:
    A: symmetric positive definite matrices [..., k, k].
    b: right-hand sides [..., k].

  Returns:
    x [..., k].
  """
  k = A.shape[-1]
  if k <= UNROLL_MAX:
    return _cholesky_solve_unrolled({(i, j): A[..., i, j] for i in range(k) for j in range(i, k)},
                                    [b[..., i] for i in range(k)])
  return _cholesky_solve_loop(A, b)


def _ridge(G: jax.Array, ridge: float) -> jax.Array:
  k = G.shape[-1]
  scale = jnp.trace(G, axis1=-2, axis2=-1) / k
  return (ridge * scale + jnp.finfo(G.dtype).tiny)[..., None, None] * jnp.eye(k, dtype=G.dtype)


def least_squares(Z: jax.Array, y: jax.Array, ridge: float = RIDGE) -> jax.Array:
  """Least-squares heads w = argmin_w ||Z w - y||^2, batched over leading axes.

  The rule for every shape (documented, never NaN):
  - m >= k: normal equations (Z^T Z + lam I) w = Z^T y;
  - m < k (underdetermined): the minimum-norm solution w = Z^T a, (Z Z^T + lam I) a = y;
  with lam = ridge * trace(Gram) / size + tiny. For full-rank Z this is the least-squares
  (or min-norm) solution up to a relative 1e-6; a singular Z gets the ridge solution, and an
  all-zero Z gives w = 0.
  The Gram matrices are finished before the solve starts (an optimization barrier): fused
  into the unrolled solve, XLA would recompute their reductions (see docs/benchmarks.md).
  For k <= UNROLL_MAX and m >= k the solve works on the Gram entries directly (no
  [..., k, k] arrays are formed).

  Args:
    Z: features [..., m, k].
    y: labels [..., m].
    ridge: the relative ridge of lam (default RIDGE, 1e-6).

  Returns:
    w [..., k].
  """
  m, k = Z.shape[-2:]
  if m >= k and k <= UNROLL_MAX:
    G, b = jax.lax.optimization_barrier(_gram_entries(Z, y))
    lam = ridge * sum(G[j, j] for j in range(k)) / k + jnp.finfo(Z.dtype).tiny
    return _cholesky_solve_unrolled({ij: g + lam if ij[0] == ij[1] else g
                                     for ij, g in G.items()}, b)
  if m >= k:
    G, b = jax.lax.optimization_barrier(gram(Z, y))
    return solve_spd(G + _ridge(G, ridge), b)
  G = jax.lax.optimization_barrier(gram(jnp.swapaxes(Z, -1, -2)))
  a = solve_spd(G + _ridge(G, ridge), y)
  return jnp.einsum("...mk,...m->...k", Z, a)


def head_gd(Z: jax.Array, y: jax.Array, w: jax.Array, lr, steps: int) -> jax.Array:
  """`steps` gradient steps on w of (1/2m) ||Z w - y||^2, batched over leading axes.

  Args:
    Z: features [..., m, k].
    y: labels [..., m].
    w: the initial heads [..., k].
    lr: the step size.
    steps: the number of steps (static).

  Returns:
    The final heads w [..., k].
  """
  m = Z.shape[-2]

  def step(_, w):
    residual = jnp.einsum("...mk,...k->...m", Z, w) - y
    return w - lr * jnp.einsum("...mk,...m->...k", Z, residual) / m

  return jax.lax.fori_loop(0, steps, step, w)


def fit_models(X: jax.Array, y: jax.Array, B: jax.Array | None = None) -> jax.Array:
  """Personal models theta_i = B w_i, w_i the least-squares head on X_i B [m, k].

  Args:
    X: the clients' samples [n, m, d].
    y: their labels [n, m].
    B: the representation [d, k]; None fits each client in R^d (local only, B = I_d).

  Returns:
    theta [n, d].
  """
  if B is None:
    return least_squares(X, y)
  w = least_squares(jnp.einsum("nmd,dk->nmk", X, B), y)
  return w @ B.T
