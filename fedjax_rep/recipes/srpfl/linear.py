"""srpfl-linear: principal angle vs simulated wall-clock time, SRPFL vs FedRep with full
participation, fixed and dynamic client speeds, communication cost C in {0, 10, 100}
(SRPFL Section 4 and Algorithm 2, with the experiments' speed models of Section 5).

Setting (the paper runs no linear experiment; these are our choices): N = M = 100 clients,
all sampled every round, d = 10, k = 2, m = 5 fresh samples per client per round, label
noise std 0.1, lr 0.1, method-of-moments init, QR after every server average. SRPFL
starts with the fastest n0 = 10 and doubles every 20 rounds (10, 20, 40, 80, 100). Speeds:
fixed (time per local update Exp(1), drawn once per client) or dynamic (every round
Exp(lambda_i), lambda_i ~ U[1/N, 1]). One local update per round. The dashed line is the
target distance c_hat x FedRep's floor (see srpfl_common).
"""

import dataclasses

import numpy as np

from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.kit import shared
from fedjax_rep.recipes.srpfl import common as sc
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(sc.Panels, sc.TimedConfig):
  algorithms: tuple = cfg.choice("algorithms to compare (fedrep sets the target)",
                                 sc.DEFAULT_ALGORITHMS, sc.DEFAULT_ALGORITHMS, sequence=True)

  def check(self):
    self.check_timed((self.num_clients,))


def run(config: Config, seeds: int, batch) -> list[dict]:
  keys = shared.seed_keys(config.seed, seeds)
  rows = []
  for speed in config.speed_models:
    rows += sc.run_panel(config, keys, batch, num_clients=config.num_clients,
                         speed=speed, comm_costs=config.comm_costs, algorithms=config.algorithms)
  return rows


def plot(rows, config: Config, file) -> None:
  fig, axes = plotting.figure(len(config.comm_costs), width=4.6, rows=len(config.speed_models))
  axes = np.asarray(axes).reshape(len(config.speed_models), len(config.comm_costs))
  for i, speed in enumerate(config.speed_models):
    for j, comm_cost in enumerate(config.comm_costs):
      ax = axes[i, j]
      panel = plotting.select(rows, speed_model=speed, comm_cost=comm_cost)
      for name in config.algorithms:
        plotting.line(ax, panel, "wall_clock", "principal_angle", sc.label(name),
                      along="round", algorithm=name)
      ax.axhline(np.mean([r["target"] for r in panel]), color="black", ls="--", lw=1,
                 label="target")
      ax.set(xscale="log", yscale="log", title=f"{speed} speeds, C = {comm_cost:g}",
             xlabel="simulated wall-clock time", ylabel="principal angle distance")
  fig.suptitle(f"SRPFL (linear): N={config.num_clients}, d={config.dim}, k={config.rep_dim}, "
               f"m={config.samples_per_client}, n0={config.n0}")
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="srpfl-linear",
    rank=100,
    docs="docs/papers/srpfl.md",
    summary="SRPFL: principal angle vs simulated wall-clock time, SRPFL vs FedRep, fixed and "
            "dynamic speeds, C in {0, 10, 100}",
    config=Config, quick={"rounds": 250, "floor_rounds": 50}, run=run, plot=plot,
    default_seeds=5))
