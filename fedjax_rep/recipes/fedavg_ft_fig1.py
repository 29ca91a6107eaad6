"""fedavg-ft-fig1: FedAvg with tau local steps learns the representation, D-GD does not
(FedAvg-FT Fig. 1): principal angle distance of the global B vs rounds.

Training setting and our choices: see `fedavg_ft_common` (d=100, k=5, M=40, population
losses, lr 0.2, sqrt(lr) B0 orthonormal, w0 = 0). FedAvg with tau in {2, 5, 10} (registry
names fedavg-tau2/5/10) and D-GD (tau = 1, `d-gd`), 10 seeds with a min-max band.
"""

import dataclasses

from fedjax_rep.recipes import config as cfg
from fedjax_rep.recipes import fedavg_ft_common as ft
from fedjax_rep.recipes import linear_common as common
from fedjax_rep.recipes import plotting
from fedjax_rep.recipes.registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config:
  num_clients: int = common.num_clients(40)
  dim: int = common.dim(100)
  rep_dim: int = common.rep_dim(5)
  rounds: int = common.rounds(2000)
  participation: float = common.participation(1.0)
  lr: float = common.lr(0.2, "step size alpha of every local GD step")
  local_steps: tuple = cfg.positive_int("local steps tau to compare (1 = D-GD)", (1, 2, 5, 10),
                                        sequence=True)
  data_mode: str = ft.data_mode()
  samples_per_client: int = common.samples_per_client(100)
  noise_std: float = common.noise_std(0.0)
  seed: int = common.seed()

  def check(self):
    common.check_rep_dim(self)


def run(config: Config, seeds: int, unit, progress: bool = True) -> list[dict]:
  seed_values = list(range(config.seed, config.seed + seeds))
  keys = common.seed_keys(config.seed, seeds)
  rows = []
  for tau in config.local_steps:
    name, _, trained = ft.train(config, keys, tau, unit, progress)
    metrics = {k: v for k, v in trained.items() if k not in ("B", "w")}
    rows += common.round_rows(name, seed_values, metrics, local_steps=tau)
  return rows


def plot(rows, config: Config, file) -> None:
  fig, (ax,) = plotting.figure(1, width=5.5)
  for tau in config.local_steps:
    name = ft.algorithm_name(tau)
    plotting.line(ax, rows, "round", "principal_angle", name, algorithm=name)
  ax.set(yscale="log", xlabel="communication round", ylabel="principal angle distance",
         title=f"FedAvg-FT Fig. 1: d={config.dim}, k={config.rep_dim}, M={config.num_clients}")
  ax.legend()
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="fedavg-ft-fig1",
    summary="FedAvg-FT Fig. 1: FedAvg (tau = 2, 5, 10) learns the representation, D-GD does not",
    config=Config, quick={"rounds": 1000}, run=run, plot=plot, default_seeds=10))
