"""FedProx (Li et al. 2020) and FedProx + FT: FedAvg whose clients add a proximal term.

Each sampled client trains the global model w_g for `local_epochs` on its cross-entropy
plus (prox_mu / 2) ||w - w_g||^2 (prox_mu: the traced option, default 0.01), which keeps
it near the round's global model; the server averages as FedAvg does. The reported loss is
the cross-entropy alone. With `ft_epochs` > 0 (FedProx + FT) every client fine-tunes the
head before it is tested.
"""

import dataclasses

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import FT_EPOCHS, Option, epochs_option


@dataclasses.dataclass(frozen=True)
class FedProx(Personalized):
  """One global model (every param shared); ft_epochs > 0: FedProx + FT."""
  options = (Option("prox_mu", 0.01, help="FedProx's proximal weight mu"),
             epochs_option(FT_EPOCHS))
  traced_epochs = FT_EPOCHS
  ft_epochs: int = 0
  name: str = "fedprox"

  def labels(self, flat):
    return params_lib.all_shared(flat)

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    def loss(params, xb, yb, wb, k):
      prox = 0.5 * self.option(hparams, "prox_mu") * train.sq_distance(params, shared)
      return self.loss(params, xb, yb, wb, k) + train.gradient_only(prox)

    trained, mean_loss = self.sgd(loss, shared, x, y, count, key, hparams, self.local_epochs)
    return trained, personal, mean_loss

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    return self.fine_tuned(params_lib.merge(shared, personal), x, y, count, key, hparams,
                           self.ft_epochs)
