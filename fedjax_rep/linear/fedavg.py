"""FedAvg on the linear model: one global (B, w), `local_steps` GD steps per client, averaging.

Each sampled client starts from the global (B, w) and takes `local_steps` gradient steps on
both of (1/2m)||X_i B w - y_i||^2; the server averages the clients' (B_i, w_i). With
`head_fit=True` the personal models are the global B with a per-client least-squares head
fitted on the client's own data (FedAvg + head fine-tuning); otherwise every client uses w.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.linear import heads as heads_lib
from fedjax_rep.linear import init as init_lib
from fedjax_rep.linear.fedrep import round_metrics
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.linear.problem import FixedData


@struct.dataclass
class GlobalState:
  """The global model: representation B [d, k] and head w [k]."""
  B: jax.Array
  w: jax.Array


def local_gd(B, w, X, y, lr, steps: int):
  """`steps` simultaneous GD steps on (B [d, k], w [k]) of (1/2m)||X B w - y||^2; X [m, d]."""
  m = X.shape[0]

  def step(_, params):
    B, w = params
    residual = X @ (B @ w) - y
    grad_x = X.T @ residual / m
    return B - lr * jnp.outer(grad_x, w), w - lr * B.T @ grad_x

  return jax.lax.fori_loop(0, steps, step, (B, w))


@dataclasses.dataclass(frozen=True)
class FedAvg:
  """FedAvg family. Structure (static): rep_dim k, cohort size, local_steps, head_fit, init."""
  rep_dim: int
  cohort: int
  local_steps: int = 1
  head_fit: bool = False
  init_method: str = "moments"
  name: str = "fedavg"

  def init(self, key, data, hparams: LinearHparams) -> GlobalState:
    """B0 by `init_method`; the head starts at zero."""
    del hparams
    B = init_lib.init_representation(key, data, self.rep_dim, self.init_method)
    return GlobalState(B=B, w=jnp.zeros((self.rep_dim,), B.dtype))

  def round(self, state: GlobalState, key, data, hparams: LinearHparams):
    key_cohort, key_data = jax.random.split(key)
    clients = cohort_lib.sample_cohort(key_cohort, data.num_clients, self.cohort)
    X, y = data.batch(key_data, clients)
    train_loss = 0.5 * jnp.mean((X @ (state.B @ state.w) - y) ** 2)
    B_i, w_i = jax.vmap(local_gd, in_axes=(None, None, 0, 0, None, None))(
        state.B, state.w, X, y, hparams.lr, self.local_steps)
    state = GlobalState(B=jnp.mean(B_i, axis=0), w=jnp.mean(w_i, axis=0))
    return state, round_metrics(state.B, lambda: self.personal_models(state, data), data,
                                train_loss)

  def personal_models(self, state: GlobalState, data) -> jax.Array:
    """theta_i [n, d]: B w for every client, or B w_i with w_i fitted on local data."""
    if self.head_fit and isinstance(data, FixedData):
      return heads_lib.fit_models(data.X, data.y, state.B)
    return jnp.broadcast_to(state.B @ state.w, (data.num_clients, state.B.shape[0]))
