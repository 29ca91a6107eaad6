"""FedAvg (McMahan et al. 2017) and FedAvg + fine-tuning: one global model.

Each sampled client trains the global model for `local_epochs`; the server averages them
(weighted by sample counts). With `ft_epochs` > 0 (FedAvg-FT, FedRep's "+FT"), every
client fine-tunes the head of the global model for `ft_epochs` on its own training data
before it is tested; training is FedAvg's. The traced option `hparams.options[FT_EPOCHS]`
(int [], at most `ft_epochs`), where present, sets how many of the `ft_epochs` run, so one
program serves FedAvg and FedAvg-FT (`family.program`).
"""

import dataclasses

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import FT_EPOCHS, epochs_option


@dataclasses.dataclass(frozen=True)
class FedAvg(Personalized):
  ft_epochs: int = 0
  name: str = "fedavg"
  options = (epochs_option(FT_EPOCHS),)

  def labels(self, flat):
    return params_lib.all_shared(flat)

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    if not self.ft_epochs:
      return shared
    return self.head_trained(shared, x, y, count, key, hparams, self.ft_epochs,
                             hparams.options.get(FT_EPOCHS))
