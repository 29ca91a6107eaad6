"""Linear FLUTE (Liu, Shen, Yang 2024, Algorithm 1, Eqs. 5-6).

Every round every client i sends the gradients of its loss L_i(w_i, B); the server takes
the data step (Eq. 5), then the step on the regulariser R(B, W) = -gamma1 ||B W||_F^2 +
gamma2 (||B^T B||_F^2 + ||W W^T||_F^2) evaluated at the previous iterate (Eq. 6):

  B~ = B - eta_l sum_i grad_B L_i,     w~_i = w_i - eta_l grad_{w_i} L_i,
  B = B~ - eta_r grad_B R(B, W),       W = W~ - eta_r grad_W R(B, W).

With eta_l = eta_r this is one gradient step on sum_i L_i + R. W = [w_1 .. w_M] is stored
as `heads` [M, k] (W^T). The loss normalisation is static: 'half-mean',
L_i = (1/2N) sum (x^T B w_i - y)^2 (the scale of the paper's Appendix A analysis), or
'mean', L_i = (1/N) sum (x^T B w_i - y)^2 (Algorithm 1 as printed: twice the gradients;
its stability at eta = 0.03: docs/papers/flute.md).
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_rep.core import aggregate
from fedjax_rep.core import checks
from fedjax_rep.linear import init as init_lib
from fedjax_rep.linear.fedrep import RepState
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.linear.metrics import round_metrics
from fedjax_rep.linear.checks import check_data

LOSSES = {"half-mean": 0.5, "mean": 1.0}  # L_i = scale * (1/N) sum of squared residuals
GAMMA1, GAMMA2 = 0.25, 0.125  # Theorem 5.1


def regularizer(B: jax.Array, heads: jax.Array, gamma1, gamma2) -> jax.Array:
  """FLUTE's regulariser R = -gamma1 ||B W||_F^2 + gamma2 (||B^T B||_F^2 + ||W W^T||_F^2).

  Args:
    B: the representation [d, k].
    heads: W^T [M, k], the M clients' heads.
    gamma1: the weight of -||B W||_F^2.
    gamma2: the weight of ||B^T B||_F^2 + ||W W^T||_F^2.

  Returns:
    R [].
  """
  return (-gamma1 * jnp.sum((B @ heads.T) ** 2)
          + gamma2 * (jnp.sum((B.T @ B) ** 2) + jnp.sum((heads.T @ heads) ** 2)))


def regularizer_grads(B: jax.Array, heads: jax.Array, gamma1, gamma2):
  """The gradients of `regularizer` R in B and the heads, in closed form.

  grad_B = B (4 gamma2 B^T B - 2 gamma1 W W^T), grad_W^T = W^T (4 gamma2 W W^T - 2 gamma1 B^T B).

  Args:
    B: the representation [d, k].
    heads: W^T [M, k], the M clients' heads.
    gamma1: the weight of -||B W||_F^2.
    gamma2: the weight of ||B^T B||_F^2 + ||W W^T||_F^2.

  Returns:
    (grad_B R [d, k], grad_heads R [M, k]).
  """
  BtB, WWt = B.T @ B, heads.T @ heads
  return (B @ (4 * gamma2 * BtB - 2 * gamma1 * WWt),
          heads @ (4 * gamma2 * WWt - 2 * gamma1 * BtB))


def data_grads(B: jax.Array, heads: jax.Array, X: jax.Array, y: jax.Array, counts: jax.Array,
               scale: float):
  """(sum_i grad_B L_i [d, k], grad_{w_i} L_i [M, k], train_loss) of the losses
  L_i = (scale / N_i) ||X_i B w_i - y_i||^2 for X [M, N, d], y [M, N], counts N_i [M].

  train_loss is mean_i (1/2N_i) ||X_i B w_i - y_i||^2 whatever the scale, as for every
  linear algorithm."""
  Z = jnp.einsum("cmd,dk->cmk", X, B)
  residual = jnp.einsum("cmk,ck->cm", Z, heads) - y
  per_sample = 2 * scale / counts[:, None] * residual  # dL_i / d(prediction) [M, N]
  grad_B = aggregate.weighted_einsum(  # a sum over clients: one [d, M N] x [M N, k] product
      "cmd,cm,ck->dk", jnp.ones(X.shape[:1], X.dtype), X, per_sample, heads)[0]
  grad_heads = jnp.einsum("cmk,cm->ck", Z, per_sample)
  loss = 0.5 * jnp.mean(jnp.sum(residual ** 2, axis=1) / counts)
  return grad_B, grad_heads, loss


@dataclasses.dataclass(frozen=True)
class Flute:
  """Linear FLUTE over all clients. Structure (static): rep_dim k and the loss scale."""
  rep_dim: int
  loss: str = "half-mean"
  name: str = "flute"
  # `core.protocols.Algorithm`: XLA's default compiler options. The blow-up bound of the
  # loop watches the model error: it measures the state after the round's update, while
  # train_loss measures the one before it (a round late).
  quick_compile: ClassVar[bool] = False
  tracked_metric: ClassVar[str | None] = "model_error"

  def __post_init__(self):
    if self.loss not in LOSSES:
      raise ValueError(f"FLUTE loss must be one of {tuple(LOSSES)}, got {self.loss!r}")
    checks.positive_ints("Flute", rep_dim=self.rep_dim)

  def check(self, data, hparams: LinearHparams) -> None:
    """The checks of a run, before anything compiles (`validation.check_data`; every client
    takes part every round)."""
    del hparams
    check_data(data, self.rep_dim)

  def init(self, key, data, hparams: LinearHparams) -> RepState:
    """B0 [d, k] and W0^T [M, k] with i.i.d. N(0, alpha^2) entries, alpha = 1/(10 d)."""
    del hparams
    key_b, key_w = jax.random.split(key)
    B = init_lib.init_representation(key_b, data, self.rep_dim, "gaussian")
    heads = init_lib.gaussian_scale(data.dim) * jax.random.normal(
        key_w, (data.num_clients, self.rep_dim))
    return RepState(B=B, heads=heads)

  def round(self, state: RepState, key, data, hparams: LinearHparams):
    clients = jnp.arange(data.num_clients)
    X, y = data.batch(key, clients)
    grad_B, grad_heads, loss = data_grads(state.B, state.heads, X, y,
                                          data.sample_counts(clients), LOSSES[self.loss])
    gamma1 = GAMMA1 if hparams.gamma1 is None else hparams.gamma1
    gamma2 = GAMMA2 if hparams.gamma2 is None else hparams.gamma2
    reg_lr = hparams.lr if hparams.reg_lr is None else hparams.reg_lr
    reg_B, reg_heads = regularizer_grads(state.B, state.heads, gamma1, gamma2)
    state = RepState(B=state.B - hparams.lr * grad_B - reg_lr * reg_B,
                     heads=state.heads - hparams.lr * grad_heads - reg_lr * reg_heads)
    return state, round_metrics(state.B, lambda: self.personal_models(state, data), data, loss)

  def personal_models(self, state: RepState, data) -> jax.Array:
    """theta_i = B w_i [M, d] with the jointly trained heads."""
    del data
    return state.heads @ state.B.T
