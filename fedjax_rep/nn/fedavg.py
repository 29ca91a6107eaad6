"""FedAvg (McMahan et al. 2017) and FedAvg + fine-tuning: one global model.

Each sampled client trains the global model for `local_epochs`; the server averages them
(weighted by sample counts). With `ft_epochs` > 0 (FedAvg-FT, FedRep's "+FT"), every
client fine-tunes the head of the global model for `ft_epochs` on its own training data
before it is tested; training is FedAvg's. The traced option `hparams.options[FT_EPOCHS]`
(int [], at most `ft_epochs`), where present, sets how many of the `ft_epochs` run, so one
program serves FedAvg and FedAvg-FT (`program.program`).
"""

import dataclasses

from fedjax_rep.nn.hparams import FT_EPOCHS
from fedjax_rep.nn.partial import PartialSharing


@dataclasses.dataclass(frozen=True)
class FedAvg(PartialSharing):
  """`PartialSharing` that shares everything; ft_epochs > 0: FedAvg-FT."""
  sharing: str = "all"
  ft_epochs: int = 0
  name: str = "fedavg"
  traced_epochs = FT_EPOCHS
