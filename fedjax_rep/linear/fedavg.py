"""FedAvg on the linear model: one global (B, w), `local_steps` GD steps per client, averaging.

Each sampled client starts from the global (B, w) and takes `local_steps` gradient steps on
both of its loss; the server averages the clients' (B_i, w_i), weighted by their numbers of
samples (equal weights for datasets of one size and for population losses). With
`head_fit=True` the personal models are the global B with a per-client least-squares head
fitted on the client's own data (FedAvg + head fine-tuning); otherwise every client uses w.
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_rep.core import aggregate
from fedjax_rep.core import checks
from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core import struct
from fedjax_rep.linear import init as init_lib
from fedjax_rep.linear.data_modes import Targets
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.linear.metrics import round_metrics
from fedjax_rep.linear.checks import check_data


@struct.dataclass
class GlobalState:
  """The global model: representation B [d, k] and head w [k]."""
  B: jax.Array
  w: jax.Array


def model_loss_and_grad(batch, theta: jax.Array, count=None):
  """One client's loss at the model theta = B w and its gradient g in theta.

  The gradients in B and w follow by the chain rule: g w^T and B^T g.

  Args:
    batch: (X [m, d], y [m]) for the sample loss (1/2 count)||X theta - y||^2, or `Targets`
      (one client's theta* [d]) for the population loss 1/2 ||theta - theta*||^2.
    theta: the model [d].
    count: the real samples of X (padding rows being zero); default m.

  Returns:
    (loss [], g [d]).
  """
  if isinstance(batch, Targets):
    residual = theta - batch.theta_star
    return 0.5 * jnp.sum(residual ** 2), residual
  X, y = batch
  count = y.shape[0] if count is None else count
  residual = X @ theta - y
  return 0.5 * jnp.sum(residual ** 2) / count, X.T @ residual / count


def local_gd(B, w, batch, lr, steps: int, train_body: bool = True, count=None):
  """`steps` simultaneous GD steps on (B, w) of one client's loss, or on w alone.

  Args:
    B: the representation [d, k].
    w: the head [k].
    batch: the client's batch, as in `model_loss_and_grad`.
    lr: the step size.
    steps: the number of steps.
    train_body: step B and w; False: w alone.
    count: the batch's real samples, as in `model_loss_and_grad`.

  Returns:
    The final (B [d, k], w [k]).
  """

  def step(_, params):
    B, w = params
    grad = model_loss_and_grad(batch, B @ w, count)[1]
    return (B - lr * jnp.outer(grad, w) if train_body else B), w - lr * B.T @ grad

  return jax.lax.fori_loop(0, steps, step, (B, w))


def global_grad_norm(B, w, batch) -> jax.Array:
  """||grad F(B, w)||, F the mean of the losses of the batch's clients.

  The round metric passes all clients: F is then the global objective of FedAvg-FT Eq. 6,
  with the 1/2 of f_i.

  Args:
    B: the representation [d, k].
    w: the head [k].
    batch: the clients' batches with a leading client axis [c, ...] (`model_loss_and_grad`).

  Returns:
    The norm [] over both B and w.
  """
  grad = jnp.mean(jax.vmap(model_loss_and_grad, in_axes=(0, None))(batch, B @ w)[1], axis=0)
  return jnp.sqrt(jnp.sum(grad ** 2) * jnp.sum(w ** 2) + jnp.sum((B.T @ grad) ** 2))


def check_model(B, w, dim: int) -> None:
  """Raises ValueError unless B is [dim, k] and w [k] (w None: B alone); shapes only, so it
  runs before anything compiles, on traced arrays too."""
  if len(B.shape) != 2 or B.shape[0] != dim or (w is not None and tuple(w.shape) != B.shape[1:]):
    head = "" if w is None else f" and w {tuple(w.shape)}"
    raise ValueError(f"the model must be B [dim={dim}, k]{'' if w is None else ' and w [k]'}; "
                     f"got B {tuple(B.shape)}{head}")


def fine_tuned_models(B, w, batch, lr, steps: int, train_body: bool = True) -> jax.Array:
  """Personal models theta_i = B_i w_i after each client fine-tunes the global (B, w).

  Each client of `batch` takes `steps` GD steps on its own loss (`local_gd`): head and body,
  or the head only (train_body=False). FedAvg + FT.

  Args:
    B: the global representation [d, k].
    w: the global head [k].
    batch: the clients' batches with a leading client axis [c, ...] (`model_loss_and_grad`).
    lr: the step size.
    steps: the number of GD steps.
    train_body: fine-tune head and body; False: the head only.

  Returns:
    theta [c, d].

  Raises:
    ValueError: B is not [d, k] or w not [k] (d: the batch's last axis).
  """
  check_model(B, w, jax.tree.leaves(batch)[0].shape[-1])
  B_i, w_i = jax.vmap(local_gd, in_axes=(None, None, 0, None, None, None))(
      B, w, batch, lr, steps, train_body)
  return jnp.einsum("cdk,ck->cd", B_i, w_i)


@dataclasses.dataclass(frozen=True)
class FedAvg:
  """FedAvg family. Structure (static): rep_dim k, cohort size, local_steps, head_fit, init."""
  rep_dim: int
  cohort: int
  local_steps: int = 1
  head_fit: bool = False
  init_method: str = "moments"
  name: str = "fedavg"
  # `core.protocols.Algorithm`: XLA's default compiler options; the blow-up bound watches
  # train_loss.
  quick_compile: ClassVar[bool] = False
  tracked_metric: ClassVar[str | None] = None

  def __post_init__(self):
    checks.positive_ints("FedAvg", rep_dim=self.rep_dim, cohort=self.cohort,
                         local_steps=self.local_steps)

  def check(self, data, hparams: LinearHparams) -> None:
    """The checks of a run, before anything compiles (`validation.check_data`); fewer samples
    than rep_dim warn only with per-client heads (`head_fit`)."""
    del hparams
    check_data(data, self.rep_dim, self.cohort, heads=self.head_fit)

  def init(self, key, data, hparams: LinearHparams) -> GlobalState:
    """B0 by `init_method`; the head starts at zero."""
    B = init_lib.init_representation(key, data, self.rep_dim, self.init_method, hparams.lr)
    return GlobalState(B=B, w=jnp.zeros((self.rep_dim,), B.dtype))

  def round(self, state: GlobalState, key, data, hparams: LinearHparams):
    key_cohort, key_data = jax.random.split(key)
    clients = cohort_lib.sample_cohort(key_cohort, data.num_clients, self.cohort)
    return self.masked_round(state, key_data, data, hparams, clients)

  def masked_round(self, state: GlobalState, key, data, hparams: LinearHparams, clients,
                   mask=None):
    """One round of the clients `clients` [c] where `mask` [c] (bool; default all) is True:
    only they enter the server's average (static shapes). `key` draws the batches."""
    batch = data.batch(key, clients)
    counts = data.sample_counts(clients)
    if mask is not None:
      counts = jnp.where(mask, counts, 0.0)
    normalizers = jnp.maximum(counts, 1)  # masked clients: any nonzero count (weight 0)
    train_loss = aggregate.weighted_mean(jax.vmap(model_loss_and_grad, in_axes=(0, None, 0))(
        batch, state.B @ state.w, normalizers)[0], counts)  # clients weigh by their samples
    B_i, w_i = jax.vmap(local_gd, in_axes=(None, None, 0, None, None, None, 0))(
        state.B, state.w, batch, hparams.lr, self.local_steps, True, normalizers)
    state = aggregate.weighted_mean(GlobalState(B=B_i, w=w_i), counts)
    metrics = round_metrics(state.B, lambda: self.personal_models(state, data), data,
                            train_loss)
    everyone = batch if clients.shape[0] == data.num_clients else data.batch(
        key, jnp.arange(data.num_clients))
    metrics["global_grad_norm"] = global_grad_norm(state.B, state.w, everyone)
    metrics["conditioning"] = jnp.linalg.norm(
        jnp.eye(self.rep_dim) - hparams.lr * state.B.T @ state.B, ord=2)
    return state, metrics

  def personal_models(self, state: GlobalState, data) -> jax.Array:
    """theta_i [n, d]: B w for every client, or B w_i with w_i fitted on local data."""
    fitted = data.refit_models(state.B) if self.head_fit else None
    if fitted is not None:
      return fitted
    return jnp.broadcast_to(state.B @ state.w, (data.num_clients, state.B.shape[0]))
