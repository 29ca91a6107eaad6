"""LG-FedAvg (Liang et al. 2020): local body, global head, the opposite split of FedRep.

Each sampled client trains all its parameters for `local_epochs`; the server averages
the last `shared_layers` layers (FedRep's code shares the last two) and every client
keeps the rest as its own. FedRep's code runs it with the authors' conventions
(`conventions`: untrained clients start from the last cohort's averaged local layers,
uniform averaging, no decay on biases); the engine's defaults are the initial layers,
count weighting and decay on every parameter.
"""

import dataclasses

from fedjax_rep.nn import conventions
from fedjax_rep.nn.partial import PartialSharing


@dataclasses.dataclass(frozen=True)
class LGFedAvg(PartialSharing):
  """`PartialSharing` that shares the last `shared_layers` layers."""
  options = (conventions.FLAGS["average_untrained"],)
  sharing: str = "last-layers"
  shared_layers: int = 2
  name: str = "lg-fedavg"
