"""FedRep (Collins et al. 2021, Algorithm 1): shared body, personal head.

Each sampled client first trains its head for `head_epochs` with the body frozen (the
body is the server's, identical for the whole cohort, so its features are computed once
for all clients as one batch), then the body for `local_epochs` with its new head frozen;
the server averages the bodies.

Conventions (`conventions`; the engine's defaults, then the authors' code's): the server
weights bodies by sample counts (Algorithm 1 and the authors' code on CIFAR: uniformly,
the option uniform_average); the paper does not say how a client that has not trained
yet starts, here from the initial head (the authors' code: the last cohort's averaged
heads, the option average_untrained), nor whether biases decay, here they do (the
authors' code: no, the option no_bias_decay). Not modelled: the authors' client uses one
optimiser for its head and body epochs, and under their PyTorch 0.4.1 the frozen head
keeps moving by momentum and weight decay during the body epochs.
"""

import dataclasses

from fedjax_rep.nn import conventions
from fedjax_rep.nn.partial import PartialSharing


@dataclasses.dataclass(frozen=True)
class FedRep(PartialSharing):
  """`PartialSharing` that shares the body, with FedRep's head phase (FedRep*: head_epochs
  = 10, the registry's fedrep-star)."""
  options = (conventions.FLAGS["average_untrained"],)
  sharing: str = "body"
  head_phase: bool = True
  head_epochs: int = 10
  name: str = "fedrep"
