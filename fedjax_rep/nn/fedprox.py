"""FedProx (Li et al. 2020) and FedProx + FT: FedAvg whose clients add a proximal term.

Each sampled client trains the global model w_g for `local_epochs` on its cross-entropy
plus (prox_mu / 2) ||w - w_g||^2, which keeps it near the round's global model; the
server averages as FedAvg does. The reported loss is the cross-entropy alone. With
`ft_epochs` > 0 (FedProx + FT) every client fine-tunes the head before it is tested.
"""

import dataclasses

from fedjax_rep.nn import train
from fedjax_rep.nn.fedavg import FedAvg


@dataclasses.dataclass(frozen=True)
class FedProx(FedAvg):
  prox_mu: float = 0.01
  name: str = "fedprox"

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    def loss(params, xb, yb, wb, k):
      prox = 0.5 * self.prox_mu * train.sq_distance(params, shared)
      return self.loss(params, xb, yb, wb, k) + train.gradient_only(prox)

    trained, mean_loss = self.sgd(loss, shared, x, y, count, key, hparams, self.local_epochs)
    return trained, personal, mean_loss
