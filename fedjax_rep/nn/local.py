"""Local only: every client trains its own model on its own data; nothing is shared.

Each sampled client trains its whole model for `local_epochs` per round (so the clients
see as many epochs as in the federated algorithms); there is no server step.
"""

import dataclasses

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.algorithm import Personalized


@dataclasses.dataclass(frozen=True)
class Local(Personalized):
  name: str = "local"

  def labels(self, flat):
    return params_lib.all_personal(flat)
