"""Registry of the linear algorithms: name -> one-line description, and `make_algorithm`."""

import re

from fedjax_rep.linear.fedavg import FedAvg
from fedjax_rep.linear.fedrep import FedRep
from fedjax_rep.linear.flute import Flute

ALGORITHMS = {
    "fedrep": "FedRep (Alg. 2): exact least-squares heads, one GD step on B, server average",
    "gd-gd": "alternating GD: one head GD step, then one GD step on B",
    "10gd-gd": "tau GD-GD: 10 head GD steps (any 'Ngd-gd'), then one GD step on B",
    "fedavg": "FedAvg on the linear model: one global (B, w), local GD steps, averaging",
    "fedavg-tau2": "FedAvg with 2 local GD steps on (B, w) (any 'fedavg-tauN')",
    "d-gd": "distributed GD: FedAvg with one local step (FedAvg-FT's baseline)",
    "flute": "linear FLUTE (Alg. 1): N(0, alpha^2) init, server GD step on the data losses and "
             "the regulariser -g1||BW||^2 + g2(||B^TB||^2 + ||WW^T||^2); all clients every round",
    "fedrep-ri": "FedRep(RI): FedRep with FLUTE's random N(0, alpha^2) initialisation",
    "local": "local only: each client's least-squares fit in R^d, no federation",
}


def make_algorithm(name: str, *, rep_dim: int, cohort: int, local_steps: int = 1,
                   head_fit: bool = False, init_method: str = "moments",
                   loss: str = "half-mean"):
  """The round-based algorithm registered as `name`: 'fedrep', 'fedrep-ri', 'gd-gd',
  'Ngd-gd', 'fedavg' (with `local_steps`), 'fedavg-tauN' (N local steps), 'd-gd' (one local
  step) or 'flute' (with loss normalisation `loss`; every client every round, so `cohort`
  does not apply)."""
  if name == "fedrep":
    return FedRep(rep_dim=rep_dim, cohort=cohort, init_method=init_method, name=name)
  if name == "fedrep-ri":
    return FedRep(rep_dim=rep_dim, cohort=cohort, init_method="gaussian", name=name)
  if name == "flute":
    return Flute(rep_dim=rep_dim, loss=loss, name=name)
  match = re.fullmatch(r"(\d*)gd-gd", name)
  if match:
    steps = int(match.group(1) or 1)
    return FedRep(rep_dim=rep_dim, cohort=cohort, head_steps=steps, init_method=init_method,
                  name=name)
  match = re.fullmatch(r"fedavg-tau(\d+)", name)
  if name in ("fedavg", "d-gd") or match:
    steps = 1 if name == "d-gd" else int(match.group(1)) if match else local_steps
    return FedAvg(rep_dim=rep_dim, cohort=cohort, local_steps=steps, head_fit=head_fit,
                  init_method=init_method, name=name)
  raise ValueError(f"unknown round-based linear algorithm {name!r}; "
                   f"known: {', '.join(a for a in ALGORITHMS if a != 'local')}")
