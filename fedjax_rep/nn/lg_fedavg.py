"""LG-FedAvg (Liang et al. 2020): local body, global head, the opposite split of FedRep.

Each sampled client trains all its parameters for `local_epochs`; the server averages
the last `shared_layers` layers (FedRep's code shares the last two) and every client
keeps the rest as its own. FedRep's code runs it with the authors' conventions
(`conventions`: untrained clients start from the last cohort's averaged local layers,
uniform averaging, no decay on biases); the engine's defaults are the initial layers,
count weighting and decay on every parameter.
"""

import dataclasses

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import conventions
from fedjax_rep.nn.algorithm import Personalized


@dataclasses.dataclass(frozen=True)
class LGFedAvg(Personalized):
  options = (conventions.FLAGS["average_untrained"],)
  shared_layers: int = 2
  name: str = "lg-fedavg"

  def labels(self, flat):
    return params_lib.last_layers_shared(self.shared_layers)(flat)
