"""FedPer (Arivazhagan et al. 2019): shared body, personal head, trained jointly.

Each sampled client trains body and head together for `local_epochs`; the server
averages the bodies. The head never leaves the client. FedRep's code runs it with the
authors' conventions (`conventions`: untrained clients start from the last cohort's
averaged heads, uniform averaging, no decay on biases); the engine's defaults are the
initial heads, count weighting and decay on every parameter.
"""

import dataclasses

from fedjax_rep.nn import conventions
from fedjax_rep.nn.partial import PartialSharing


@dataclasses.dataclass(frozen=True)
class FedPer(PartialSharing):
  """`PartialSharing` that shares the body, all parameters trained together."""
  options = (conventions.FLAGS["average_untrained"],)
  sharing: str = "body"
  name: str = "fedper"
