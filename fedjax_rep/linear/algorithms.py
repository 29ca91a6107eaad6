"""The linear algorithms in the registry (`core.registry`), and `make_algorithm`."""

import re

from fedjax_rep.core import registry
from fedjax_rep.linear.fedavg import FedAvg
from fedjax_rep.linear.fedrep import FedRep
from fedjax_rep.linear.flute import Flute


def _xla_only(name, kernel):
  """ValueError unless kernel is "xla": only exact-head FedRep has a C++ kernel."""
  if kernel != "xla":
    raise ValueError(f"kernel={kernel!r} is for 'fedrep' and 'fedrep-ri' only (exact-head "
                     f"FedRep); {name!r} runs kernel='xla' only")


def _fedrep(name, *, rep_dim, cohort, init_method="moments", kernel="xla", **_):
  return FedRep(rep_dim=rep_dim, cohort=cohort, init_method=init_method, name=name,
                kernel=kernel)


def _fedrep_ri(name, *, rep_dim, cohort, kernel="xla", **_):
  return FedRep(rep_dim=rep_dim, cohort=cohort, init_method="gaussian", name=name,
                kernel=kernel)


def _gd_gd(name, *, rep_dim, cohort, init_method="moments", kernel="xla", **_):
  _xla_only(name, kernel)
  steps = int(re.fullmatch(r"(\d*)gd-gd", name).group(1) or 1)
  return FedRep(rep_dim=rep_dim, cohort=cohort, head_steps=steps, init_method=init_method,
                name=name)


def _fedavg(name, *, rep_dim, cohort, local_steps=1, init_method="moments", kernel="xla",
            **_):
  _xla_only(name, kernel)
  match = re.fullmatch(r"fedavg-tau(\d+)", name)
  steps = 1 if name == "d-gd" else int(match.group(1)) if match else local_steps
  return FedAvg(rep_dim=rep_dim, cohort=cohort, local_steps=steps, init_method=init_method,
                name=name)


def _flute(name, *, rep_dim, loss="half-mean", kernel="xla", **_):
  _xla_only(name, kernel)
  return Flute(rep_dim=rep_dim, loss=loss, name=name)


for _args in [
    ("fedrep", "FedRep (Alg. 2): exact least-squares heads, one GD step on B, server average",
     _fedrep),
    ("gd-gd", "alternating GD: one head GD step, then one GD step on B", _gd_gd),
    ("10gd-gd", "tau GD-GD: 10 head GD steps (any 'Ngd-gd'), then one GD step on B", _gd_gd,
     r"\d+gd-gd"),
    ("fedavg", "FedAvg on the linear model: one global (B, w), local GD steps, averaging",
     _fedavg),
    ("fedavg-tau2", "FedAvg with 2 local GD steps on (B, w) (any 'fedavg-tauN')", _fedavg,
     r"fedavg-tau\d+"),
    ("d-gd", "distributed GD: FedAvg with one local step (FedAvg-FT's baseline)", _fedavg),
    ("flute", "linear FLUTE (Alg. 1): N(0, alpha^2) init, server GD step on the data losses "
     "and the regulariser -g1||BW||^2 + g2(||B^TB||^2 + ||WW^T||^2); all clients every round",
     _flute),
    ("fedrep-ri", "FedRep(RI): FedRep with FLUTE's random N(0, alpha^2) initialisation",
     _fedrep_ri),
]:
  registry.register("linear", *_args)

ALGORITHMS = registry.ALGORITHMS["linear"]


def make_algorithm(name: str, *, rep_dim: int, cohort: int | None = None, local_steps: int = 1,
                   init_method: str = "moments", loss: str = "half-mean", kernel: str = "xla"):
  """The round-based linear algorithm registered as `name`, with its structure.

  Local-only training is `local.local_models` (no rounds).

  Args:
    name: 'fedrep', 'fedrep-ri', 'gd-gd', 'Ngd-gd', 'fedavg' (with `local_steps`),
      'fedavg-tauN' (N local steps), 'd-gd' (one local step), all of which need `cohort`,
      or 'flute' (every client every round, so no cohort).
    rep_dim: the representation's dimension k (B is [d, k]).
    cohort: the clients sampled per round (not for 'flute').
    local_steps: the local GD steps per round of 'fedavg'.
    init_method: how B0 is drawn (`init.init_representation`: "moments", "random",
      "random-scaled", "gaussian"); 'fedrep-ri' and 'flute' start from FLUTE's Gaussian
      B0 whatever it says.
    loss: the loss normalisation of 'flute', "half-mean" (1/(2N)) or "mean" (1/N).
    kernel: `FedRep.kernel` of 'fedrep' and 'fedrep-ri' (exact-head FedRep): "xla"
      (default) or "native" (the opt-in C++ round). Any other algorithm takes "xla" only.

  Returns:
    The algorithm: a `FedRep`, `FedAvg` or `Flute` (a frozen dataclass).

  Raises:
    ValueError: an unknown name, or a kernel other than "xla" for an algorithm without one.
  """
  return registry.make(name, "linear", rep_dim=rep_dim, cohort=cohort, local_steps=local_steps,
                       init_method=init_method, loss=loss, kernel=kernel)
