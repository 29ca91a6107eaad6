"""fedavg-ft-fig1: FedAvg with tau local steps learns the representation, D-GD does not
(FedAvg-FT Fig. 1): principal angle distance of the global B vs rounds.

Training setting and our choices: see `fedavg_ft_common` (d=100, k=5, M=40, population
losses, lr 0.2, sqrt(lr) B0 orthonormal, w0 = 0). FedAvg with tau in {2, 5, 10} (registry
names fedavg-tau2/5/10) and D-GD (tau = 1, `d-gd`), 10 seeds with a min-max band.
"""

import dataclasses

from fedjax_rep.recipes.fedavg_ft import common as ft
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.kit import shared
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(ft.TrainingConfig):
  """FedAvg with tau in {2, 5, 10} and D-GD, 2000 rounds (the training defaults)."""


def run(config: Config, seeds: int, batch) -> list[dict]:
  seed_values = config.seed_values(seeds)
  keys = shared.seed_keys(config.seed, seeds)
  rows = []
  for tau in config.local_steps:
    name, _, trained = ft.train(config, keys, tau, batch)
    metrics = {k: v for k, v in trained.items() if k not in ("B", "w")}
    rows += shared.round_rows(name, seed_values, metrics, local_steps=tau)
  return rows


def plot(rows, config: Config, file) -> None:
  plotting.one_panel(rows, "round", "principal_angle",
                     [ft.algorithm_name(tau) for tau in config.local_steps], file,
                     xlabel="communication round", ylabel="principal angle distance",
                     title=f"FedAvg-FT Fig. 1: d={config.dim}, k={config.rep_dim}, "
                     f"M={config.num_clients}")


RECIPE = register(Recipe(
    name="fedavg-ft-fig1",
    rank=40,
    docs="docs/papers/fedavg_ft.md",
    summary="FedAvg-FT Fig. 1: FedAvg (tau = 2, 5, 10) learns the representation, D-GD does not",
    config=Config, quick={"rounds": 1000}, run=run, plot=plot, default_seeds=10))
