"""FedRep on linear models: exact heads (Algorithm 2), GD-GD and tau GD-GD.

Each round a cohort of clients each computes its head on its batch with B frozen: the exact
least-squares head (`head_steps=None`, FedRep) or `head_steps` gradient steps from its
previous head (tau GD-GD); then one gradient step on B of (1/2m_i)||X_i B w_i - y_i||^2. The
server averages the clients' B_i = B - lr * g_i. Heads persist; clients not sampled keep theirs.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core import tree
from fedjax_rep.linear import heads as heads_lib
from fedjax_rep.linear import init as init_lib
from fedjax_rep.core import aggregate
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.linear.metrics import round_metrics


@struct.dataclass
class RepState:
  """Shared representation B [d, k] and personal heads [n, k]."""
  B: jax.Array
  heads: jax.Array


def mean_rep_gradient(X: jax.Array, residual: jax.Array, w: jax.Array,
                      counts: jax.Array | None = None, mask: jax.Array | None = None):
  """(1/c) sum_i (1/m_i) X_i^T r_i w_i^T [d, k]: the mean over clients of the gradient in B of
  (1/2m_i)||X_i B w_i - y_i||^2, for X [c, m, d], residual r = X B w - y [c, m], w [c, k].

  m_i = counts[i] real samples (padding rows are zero), default m. With `mask` [c] (bool)
  the mean is over the clients where it is True (c = their number).
  One contraction over (client, sample) (`aggregate.weighted_einsum`), instead of c small
  products.
  """
  c, m = residual.shape
  counts = jnp.full((c,), m, residual.dtype) if counts is None else counts
  weights = jnp.ones((c,), residual.dtype) if mask is None else mask.astype(residual.dtype)
  return aggregate.mean(*aggregate.weighted_einsum(
      "cmd,cm,ck->dk", weights, X, residual / counts[:, None], w))


@dataclasses.dataclass(frozen=True)
class FedRep:
  """FedRep family. Structure (static): rep_dim k, cohort size, head_steps, init, QR."""
  rep_dim: int
  cohort: int
  head_steps: int | None = None
  init_method: str = "moments"
  orthonormalize: bool = False
  name: str = "fedrep"

  def init(self, key, data, hparams: LinearHparams) -> RepState:
    """B0 by `init_method`; heads start at zero."""
    del hparams
    B = init_lib.init_representation(key, data, self.rep_dim, self.init_method)
    return RepState(B=B, heads=jnp.zeros((data.num_clients, self.rep_dim), B.dtype))

  def client_heads(self, Z, y, previous, hparams):
    """Heads [c, k] of clients with features Z = X B [c, m, k], labels y [c, m]."""
    if self.head_steps is None:
      return heads_lib.least_squares(Z, y)
    return jax.vmap(heads_lib.head_gd, in_axes=(0, 0, 0, None, None))(
        Z, y, previous, hparams.head_lr, self.head_steps)

  def round(self, state: RepState, key, data, hparams: LinearHparams):
    key_cohort, key_data = jax.random.split(key)
    clients = cohort_lib.sample_cohort(key_cohort, data.num_clients, self.cohort)
    return self.masked_round(state, key_data, data, hparams, clients)

  def masked_round(self, state: RepState, key, data, hparams: LinearHparams, clients,
                   mask=None):
    """One round of the clients `clients` [c] where `mask` [c] (bool; default all) is True:
    only they update their heads and enter the server's average (static shapes: the
    cohort keeps its size c whatever the mask). `key` draws the batches."""
    X, y = data.batch(key, clients)
    Z = jnp.einsum("cmd,dk->cmk", X, state.B)
    previous = tree.gather(state.heads, clients)
    w = self.client_heads(Z, y, previous, hparams)
    if mask is not None:
      w = jnp.where(mask[:, None], w, previous)
    residual = jnp.einsum("cmk,ck->cm", Z, w) - y
    counts = data.sample_counts(clients)
    B = state.B - hparams.lr * mean_rep_gradient(X, residual, w, counts, mask)
    if self.orthonormalize:
      B = jnp.linalg.qr(B)[0]
    state = RepState(B=B, heads=tree.scatter(state.heads, clients, w))
    losses = 0.5 * jnp.sum(residual ** 2, axis=1) / counts
    train_loss = jnp.mean(losses) if mask is None else aggregate.weighted_mean(
        losses, mask.astype(losses.dtype))
    return state, round_metrics(B, lambda: self.personal_models(state, data), data, train_loss)

  def personal_models(self, state: RepState, data) -> jax.Array:
    """theta_i = B w_i [n, d]. With fixed local data each client refits its head on its own
    data for the current B (least squares); otherwise its stored head is used."""
    fitted = data.refit_models(state.B)
    return state.heads @ state.B.T if fitted is None else fitted
