"""Neural collapse of heads: FLUTE's NC regulariser and NC2 metrics (Eq. 10, App. B.3, C.2).

A head kernel H [F, C] (the paper's H_i) has the class Gram matrix G = H^T H [C, C]; for a
client whose training data hold the classes u [C] (bool) and an ETF size s >= 2,

  D_s(H, u) = || G / ||G||_F  -  (u u^T) o (I_C - 1_C 1_C^T / s) / sqrt(s - 1) ||_F

(o elementwise; the outer norm not squared) is the distance to the s-class simplex ETF's
pattern on u (cosines -1/(s - 1)). D_|u| is 0 at a |u|-point ETF on u with zero heads for
the other classes, local training's optimum (Observation B.2); unless u holds every class,
D_C >= 1 - t > 0, t the pattern's norm (1 - t = 0.57 for 2 of 10), with equality at heads
in that pattern, the global optimum (Observation B.3). `nc_term` = NC_i = D_C(H_i, u_i)
(Eq. 10); Global NC2 = its mean over all clients; Averaged Local NC2 = the mean of
D_|u_i|(H_i, u_i) over the clients with |u_i| >= 2, 0 if none (App. C.2). Norms are clamped
away from 0 (`_norm`): a zero head or an exact ETF has a zero (sub)gradient, not NaN.
"""

import jax
import jax.numpy as jnp

from fedjax_rep.core import aggregate


def class_mask(y: jax.Array, count: jax.Array, num_classes: int) -> jax.Array:
  """Classes present [..., num_classes] (bool) among the first `count` [...] labels of
  y [..., m] (the rest are padding)."""
  def one(labels, n):  # padding rows scatter out of range, and are dropped
    labels = jnp.where(jnp.arange(labels.shape[0]) < n, labels, num_classes)
    return jnp.zeros(num_classes, bool).at[labels].set(True, mode="drop")

  return jnp.vectorize(one, signature="(m),()->(c)")(y, count)


def _norm(a: jax.Array) -> jax.Array:
  """The Frobenius norm of a, clamped at sqrt(tiny): a zero gradient at a = 0."""
  return jnp.sqrt(jnp.maximum(jnp.sum(a * a), jnp.finfo(a.dtype).tiny))


def etf_distance(kernel: jax.Array, classes: jax.Array, size) -> jax.Array:
  """D_size(H, u) [] (the module docstring) of a head kernel H [F, C] and the client's
  classes u [C] (bool); size: the ETF's number of points s >= 2 (may be traced)."""
  gram = kernel.T @ kernel
  u = classes.astype(kernel.dtype)
  centred = jnp.eye(kernel.shape[1], dtype=kernel.dtype) - 1.0 / size
  pattern = jnp.outer(u, u) * centred / jnp.sqrt(size - 1.0)
  return _norm(gram / _norm(gram) - pattern)


def nc_term(kernel: jax.Array, classes: jax.Array) -> jax.Array:
  """NC_i(H_i) [] of Eq. 10: D_C of a head kernel [F, C] on its client's classes [C] (bool),
  C the number of all classes."""
  if kernel.shape[1] < 2:
    raise ValueError(f"the NC term needs at least 2 classes, the head has {kernel.shape[1]}")
  return etf_distance(kernel, classes, kernel.shape[1])


def nc2_metrics(kernels: jax.Array, classes: jax.Array) -> dict:
  """{'global_nc2': [], 'local_nc2': []}: Global NC2 and Averaged Local NC2 (the module
  docstring) of every client's head kernel, kernels [n, F, C], with its classes [n, C]
  (bool)."""
  sizes = jnp.sum(classes, axis=1)
  local = jax.vmap(etf_distance)(kernels, classes, jnp.maximum(sizes, 2))
  return {"global_nc2": jnp.mean(jax.vmap(nc_term)(kernels, classes)),
          "local_nc2": aggregate.weighted_mean(local, (sizes >= 2).astype(local.dtype))}
