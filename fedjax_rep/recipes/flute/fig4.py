"""flute-fig4: FLUTE with gamma1 in {2 gamma2, gamma2, 2 gamma2 / 3} (FLUTE Fig. 4, App. C.1).

Setting of the paper: d = 10, k = 6, M = 10, N in {8, 9, 10, 11}, App. C.1's problem
(Lambda_ii = 2d - i + 1, noise variance 0.3, eta = 0.03). Claim: gamma1 = gamma2 is best for
N in {8, 9, 10}; gamma1 > 2 gamma2 usually diverges. Our choices: gamma2 = 1/8, the 1/(2N)
loss, 1000 rounds, 5 seeds. All (gamma1, N, seed) runs are one vmapped program; a run that
diverges is flagged (and the others go on).
"""

import dataclasses

from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.flute import common as fc
from fedjax_rep.recipes.kit import linear
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.kit import shared
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(fc.ProblemConfig):
  rep_dim: int = linear.rep_dim(6)
  num_clients: int = cfg.num_clients(10)
  samples_per_client: tuple = cfg.positive_int("samples per client N, one panel each",
                                               (8, 9, 10, 11), sequence=True)
  gamma1_ratios: tuple = cfg.setting((2.0, 1.0, 2 / 3), cfg.Check(float, low=0.0, open_low=True,
                                                                   sequence=True),
                                     "gamma1 / gamma2 values to compare")

  def check(self):
    fc.check_rep_dims(self)


def run(config: Config, seeds: int, batch) -> list[dict]:
  return fc.run_cell(config, shared.seed_keys(config.seed, seeds), batch,
                     rep_dim=config.rep_dim, num_clients=config.num_clients,
                     samples=config.samples_per_client, algorithms=("flute",),
                     gamma1s=tuple(r * config.gamma2 for r in config.gamma1_ratios))


def plot(rows, config: Config, file) -> None:
  fig, axes = plotting.grid_of(len(config.samples_per_client))
  for ax, n in zip(axes, config.samples_per_client):
    fc.panel(ax, rows, [(f"gamma1 = {r:.3g} gamma2", {"gamma1": float(r * config.gamma2),
                                                       "samples_per_client": n})
                        for r in config.gamma1_ratios], f"N = {n}")
  fig.suptitle(f"FLUTE Fig. 4: d={config.dim}, k={config.rep_dim}, M={config.num_clients}, "
               f"gamma2={config.gamma2}, {config.loss} loss")
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="flute-fig4",
    rank=90,
    docs="docs/papers/flute.md",
    summary="FLUTE Fig. 4: FLUTE's model error for gamma1 in {2, 1, 2/3} x gamma2, N in 8..11",
    config=Config, quick={"rounds": 300}, run=run, plot=plot, default_seeds=5))
