"""SCAFFOLD (Karimireddy et al. 2020) and SCAFFOLD + FT: FedAvg with control variates.

The server keeps, besides the global model w, a control variate c; every client keeps
its own c_i (all start at 0). A sampled client trains w for `local_epochs` with every
gradient corrected by c - c_i (before weight decay and momentum), K real steps in all,
then sets c_i+ = c_i - c + (w - w_i) / (K lr) (the paper's option II) and sends w_i and
c_i+ - c_i. The server averages the w_i weighted by sample counts (as FedAvg) and sets
c <- c + sum_i (c_i+ - c_i) / n over the n clients. With `ft_epochs` > 0 (SCAFFOLD + FT)
every client fine-tunes the head before it is tested. The reported loss is the
cross-entropy (the correction adds to the gradient only).

The server's c is its server state (`initial_server`: {'control': c}, one leaf per model
param); a client's personal dict holds its c_i under 'control/<param>'.
"""

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import FT_EPOCHS, epochs_option

CONTROL = "control/"


@dataclasses.dataclass(frozen=True)
class Scaffold(Personalized):
  """One global model (every param shared); ft_epochs > 0: SCAFFOLD + FT."""
  options = (epochs_option(FT_EPOCHS),)
  traced_epochs = FT_EPOCHS
  ft_epochs: int = 0
  name: str = "scaffold"
  server_sent = ("control",)  # c goes down with w; clients send w_i and c_i+ - c_i up

  def labels(self, flat):
    return params_lib.all_shared(flat)

  def initial_parts(self, flat):
    return flat, {CONTROL + p: jnp.zeros_like(v) for p, v in flat.items()}

  def initial_server(self, shared, personal):
    return {"control": jax.tree.map(jnp.zeros_like, shared)}

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    c = info.server["control"]
    correction = {p: c[p] - personal[CONTROL + p] for p in shared}

    def loss(params, xb, yb, wb, k):
      linear = sum(jnp.vdot(params[p], correction[p], precision=self.model.precision)
                   for p in params)
      return self.loss(params, xb, yb, wb, k) + train.gradient_only(linear)

    trained, mean_loss = self.sgd(loss, shared, x, y, count, key, hparams, self.local_epochs)
    steps = jnp.maximum(self.local_epochs * jnp.ceil(count / self.batch_size), 1.0)
    control = {CONTROL + p: personal[CONTROL + p] - c[p]
               + (shared[p] - trained[p]) / (steps * hparams.lr) for p in shared}
    return (trained, {c: control[c] - personal[c] for c in control}), control, mean_loss

  def server_update(self, shared, sent, weights, hparams, info):
    models, deltas = sent
    shared, _ = super().server_update(shared, models, weights, hparams, info)
    sums, _ = self.cohort_sum(deltas, (weights > 0).astype(jnp.float32))
    c = info.server["control"]
    return shared, {"control": {p: c[p] + sums[CONTROL + p] / info.num_clients for p in c}}

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    return self.fine_tuned(shared, x, y, count, key, hparams, self.ft_epochs)

  def new_clients(self, state, data, hparams, key, epochs: int) -> dict:
    return super().new_clients(state.replace(personal={}), data, hparams, key, epochs)
