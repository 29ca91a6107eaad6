"""FedBABU (Oh, Kim & Yun, ICLR 2022, "FedBABU: Towards Enhanced Representation for Federated
Image Classification"): FedAvg on the body only, under a head frozen at its random
initialisation; every client fine-tunes the global model before it is tested.

A sampled client trains its body for `local_epochs` with the head frozen and sends it; the
server averages the bodies weighted by sample counts. The head keeps its initial bits (the
model's own random initialisation, the same for all clients) for the whole run. At every
evaluation each client fine-tunes the server's model for `ft_epochs` on its own training
data (`train.sgd_epochs` from a fresh optimiser state): body and head together (the traced
flag `babu_ft_body`, default 1) or the head alone. New clients (`new_clients`) fine-tune
the global model the same way, its frozen head included. Departures from PFLlib's
clientbabu.py: docs/papers/fedrep.md.
"""

import dataclasses

import jax

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import Option


@dataclasses.dataclass(frozen=True)
class FedBABU(Personalized):
  """One global model, its head frozen in training; ft_epochs: the fine-tuning epochs."""
  options = (Option("babu_ft_body", 1.0, flag=True,
                    help="FedBABU's fine-tuning before testing: 1 body and head, 0 the head "
                         "alone"),)
  ft_epochs: int = 0
  name: str = "fedbabu"

  def labels(self, flat):
    return params_lib.all_shared(flat)

  def check(self, data, hparams):
    super().check(data, hparams)
    if isinstance(self.ft_epochs, bool) or not isinstance(self.ft_epochs, int) or (
        self.ft_epochs < 0):
      raise ValueError(f"ft_epochs={self.ft_epochs!r} must be an integer >= 0: the epochs of "
                       f"fine-tuning before testing (0: test the global model)")

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    body, head = params_lib.split(shared, params_lib.head_personal(shared))

    def body_loss(params, xb, yb, wb, k):
      return self.loss(params_lib.merge(params, head), xb, yb, wb, k)

    body, loss = self.sgd(body_loss, body, x, y, count, key, hparams, self.local_epochs)
    return body, personal, loss

  private_server = True  # its server_update averages the bodies sent

  def server_update(self, shared, sent, weights, hparams, info):
    """The count-weighted mean of the bodies the cohort sent; the head as it was."""
    body, _ = params_lib.split(shared, params_lib.head_personal(shared))
    body, server = super().server_update(body, sent, weights, hparams, info)
    return {**shared, **body}, server

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    """The server's model fine-tuned for ft_epochs: body and head, or (babu_ft_body 0) the
    head alone (a traced flag: both, selected by `jax.lax.cond`)."""
    flat = params_lib.merge(shared, personal)
    if not self.ft_epochs:
      return flat
    whole = lambda: self.sgd(self.loss, flat, x, y, count, key, hparams, self.ft_epochs)[0]
    head = lambda: self.fine_tuned(flat, x, y, count, key, hparams, self.ft_epochs)
    ft_body = self.option(hparams, "babu_ft_body")
    if isinstance(ft_body, float):
      return whole() if ft_body else head()
    return jax.lax.cond(ft_body > 0, whole, head)

  def new_clients(self, state, data, hparams, key, epochs: int) -> dict:
    """Accuracy of new clients (`data`: their own train and test sets) that fine-tune the
    global model for `epochs` as `evaluate`'s clients do (new client i with key
    fold_in(key, i)), unsharded."""
    fresh = state.replace(eval_key=jax.random.key_data(key), cohort=None)  # all tested
    tuning = dataclasses.replace(self, ft_epochs=epochs, devices=None, cohort_groups=None)
    return tuning.evaluate(fresh, data, hparams)
