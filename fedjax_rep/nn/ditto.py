"""Ditto (Li et al. 2021): a global model trained by FedAvg and, at every client, a
personal model regularised towards it.

Each sampled client (1) trains a copy of the round's global model w for `local_epochs`
(sent to the server, which averages them as FedAvg does), then (2) trains its own model v
for `local_epochs` on its cross-entropy plus (ditto_lambda / 2) ||v - w||^2 (the traced
option, default 0.1). Clients are tested with v. The reported loss is the personal model's
cross-entropy.
"""

import dataclasses

import jax

from fedjax_rep.nn import train
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import Option


@dataclasses.dataclass(frozen=True)
class Ditto(Personalized):
  options = (Option("ditto_lambda", 0.1,
                     help="Ditto's weight lambda pulling personal models to the global one"),)
  name: str = "ditto"

  def initial_parts(self, flat):
    return flat, flat  # the global model, and every client's personal copy of it

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    key_global, key_personal = jax.random.split(key)
    global_model, _ = self.sgd(self.loss, shared, x, y, count, key_global, hparams,
                               self.local_epochs)

    def loss(params, xb, yb, wb, k):
      prox = 0.5 * self.option(hparams, "ditto_lambda") * train.sq_distance(params, shared)
      return self.loss(params, xb, yb, wb, k) + train.gradient_only(prox)

    personal, mean_loss = self.sgd(loss, personal, x, y, count, key_personal, hparams,
                                   self.local_epochs)
    return global_model, personal, mean_loss

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    return personal
