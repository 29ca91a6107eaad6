"""How the figures name the algorithms: one table of labels, as the papers spell them."""

LABELS = {
    "local": "Local only", "fedavg": "FedAvg", "fedavg-ft": "FedAvg + FT",
    "fedprox": "FedProx", "fedprox-ft": "FedProx + FT", "scaffold": "SCAFFOLD",
    "scaffold-ft": "SCAFFOLD + FT", "fed-mtl": "Fed-MTL", "per-fedavg": "Per-FedAvg",
    "lg-fedavg": "LG-FedAvg", "l2gd": "L2GD", "apfl": "APFL", "ditto": "Ditto",
    "fedper": "FedPer", "fedrep": "FedRep", "fedbabu": "FedBABU", "fedrep-star": "FedRep*",
    "fedrod": "FedRoD", "fedcp": "FedCP", "flute": "FLUTE", "flute-star": "FLUTE*",
    "fedrep-ri": "FedRep(RI)", "gd-gd": "GD-GD", "10gd-gd": "10GD-GD", "d-gd": "D-GD",
    "d-sgd": "D-SGD", "fedavg-steps": "FedAvg", "srpfl": "SRPFL", "lg-srpfl": "LG-SRPFL",
    "flanp": "FLANP", "flanp-ft": "FLANP-FT", "fastest-n": "fastest n0 only",
    "centaur": "CENTAUR", "dp-fedavg-ft": "DP-FedAvg-FT",
}


def label(name: str) -> str:
  """An algorithm's name in a figure: its entry of LABELS, 'FedAvg, τ = 2' for the linear
  'fedavg-tau2', else the name itself (e.g. a plugin's algorithm).

  Args:
    name: the algorithm's registered name.

  Returns:
    Its label.
  """
  steps = name.removeprefix("fedavg-tau")
  return f"FedAvg, τ = {steps}" if steps != name else LABELS.get(name, name)
