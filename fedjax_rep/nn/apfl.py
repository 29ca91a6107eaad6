"""APFL (Deng et al. 2020): adaptive personalised FL, a client's model the mix
v_bar = apfl_alpha * v + (1 - apfl_alpha) * w of its own model v and the global one w.

Each sampled client takes `local_epochs` of SGD steps on both at once from the same
minibatches: w by the gradient of its cross-entropy at w, v by that of the cross-entropy
at v_bar (i.e. apfl_alpha times the gradient at v_bar); the server averages the w's as
FedAvg does. Clients are tested with v_bar (their v mixed with the server's w). The mixing
weight is the traced option apfl_alpha (default 0.25), fixed over the run (APFL's
non-adaptive variant). The reported loss is that of v_bar.
"""

import dataclasses

import jax

from fedjax_rep.nn import train
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import Option


@dataclasses.dataclass(frozen=True)
class APFL(Personalized):
  options = (Option("apfl_alpha", 0.25, high=1.0,
                     help="APFL's mixing weight alpha of the local model"),)
  name: str = "apfl"

  def initial_parts(self, flat):
    return flat, flat  # the global model w, and every client's own model v

  def mixed(self, w: dict, v: dict, hparams) -> dict:
    """apfl_alpha * v + (1 - apfl_alpha) * w, parameter by parameter (apfl_alpha: hparams'
    option)."""
    alpha = self.option(hparams, "apfl_alpha")
    return jax.tree.map(lambda vi, wi: alpha * vi + (1 - alpha) * wi, v, w)

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    def loss(params, xb, yb, wb, k):
      w, v = params
      key_w, key_v = jax.random.split(k)
      global_loss = self.loss(w, xb, yb, wb, key_w)
      mixed_loss = self.loss(self.mixed(jax.lax.stop_gradient(w), v, hparams), xb, yb, wb, key_v)
      return train.gradient_only(global_loss) + mixed_loss

    (w, v), mean_loss = self.sgd(loss, (shared, personal), x, y, count, key, hparams,
                                 self.local_epochs)
    return w, v, mean_loss

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    return self.mixed(shared, personal, hparams)
