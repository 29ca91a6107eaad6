"""SCAFFOLD (Karimireddy et al. 2020) and SCAFFOLD + FT: FedAvg with control variates.

The server keeps, besides the global model w, a control variate c; every client keeps
its own c_i (all start at 0). A sampled client trains w for `local_epochs` with every
gradient corrected by c - c_i (before weight decay and momentum), K real steps in all,
then sets c_i+ = c_i - c + (w - w_i) / (K lr) (the paper's option II) and sends w_i and
c_i+ - c_i. The server averages the w_i weighted by sample counts (as FedAvg) and sets
c <- c + sum_i (c_i+ - c_i) / n over the n clients. With `ft_epochs` > 0 (SCAFFOLD + FT)
every client fine-tunes the head before it is tested. The reported loss is the
cross-entropy (the correction adds to the gradient only).

The state's shared dict holds the model and, under 'control/<param>', c; a client's
personal dict holds its c_i under the same 'control/<param>' names.
"""

import dataclasses

import jax.numpy as jnp

from fedjax_rep.nn import train
from fedjax_rep.nn.fedavg import FedAvg

CONTROL = "control/"


def model_part(flat: dict) -> dict:
  """The model's params of a dict that may also hold control variates."""
  return {p: v for p, v in flat.items() if not p.startswith(CONTROL)}


@dataclasses.dataclass(frozen=True)
class Scaffold(FedAvg):
  name: str = "scaffold"

  def initial_parts(self, flat):
    zeros = {CONTROL + p: jnp.zeros_like(v) for p, v in flat.items()}
    return {**flat, **zeros}, zeros

  def client_update(self, shared, personal, x, y, count, key, hparams):
    model = model_part(shared)
    correction = {p: shared[CONTROL + p] - personal[CONTROL + p] for p in model}

    def loss(params, xb, yb, wb, k):
      linear = sum(jnp.vdot(params[p], correction[p]) for p in params)
      return self.loss(params, xb, yb, wb, k) + train.gradient_only(linear)

    trained, mean_loss = self.sgd(loss, model, x, y, count, key, hparams, self.local_epochs)
    steps = jnp.maximum(self.local_epochs * jnp.ceil(count / self.batch_size), 1.0)
    control = {CONTROL + p: personal[CONTROL + p] - shared[CONTROL + p]
               + (model[p] - trained[p]) / (steps * hparams.lr) for p in model}
    sent = {**trained, **{c: control[c] - personal[c] for c in control}}
    return sent, control, mean_loss

  def server_update(self, shared, sent, weights, num_clients):
    model = super().server_update(model_part(shared), model_part(sent), weights, num_clients)
    controls = {c: sent[c] for c in shared if c.startswith(CONTROL)}
    sums, _ = self.cohort_sum(controls, (weights > 0).astype(jnp.float32))
    control = {c: shared[c] + sums[c] / num_clients for c in controls}
    return {**model, **control}

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    return super().eval_params(model_part(shared), {}, x, y, count, key, hparams)

  def new_clients(self, state, data, hparams, key, epochs: int) -> dict:
    state = state.replace(shared=model_part(state.shared), personal={})
    return super().new_clients(state, data, hparams, key, epochs)
