"""FedAvg (McMahan et al. 2017) and FedAvg + fine-tuning: one global model.

Each sampled client trains the global model for `local_epochs`; the server averages them
(weighted by sample counts). With `ft_epochs` > 0 (FedAvg-FT, FedRep's "+FT"), every
client fine-tunes the head of the global model for `ft_epochs` on its own training data
before it is tested; training is FedAvg's.
"""

import dataclasses

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.algorithm import Personalized


@dataclasses.dataclass(frozen=True)
class FedAvg(Personalized):
  ft_epochs: int = 0
  name: str = "fedavg"

  def labels(self, flat):
    return params_lib.all_shared(flat)

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    if not self.ft_epochs:
      return shared
    body, head = params_lib.split(shared, params_lib.head_personal(shared))
    head, _ = self.train_head(body, head, x, y, count, key, hparams, self.ft_epochs)
    return params_lib.merge(body, head)
