"""Local only: every client trains its own model on its own data; nothing is shared.

Each sampled client trains its whole model for `local_epochs` per round (so the clients
see as many epochs as in the federated algorithms); there is no server step.
"""

import dataclasses

from fedjax_rep.nn.partial import PartialSharing


@dataclasses.dataclass(frozen=True)
class Local(PartialSharing):
  """`PartialSharing` that shares nothing."""
  sharing: str = "none"
  name: str = "local"
