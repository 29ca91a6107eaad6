"""flute-fig3: FLUTE vs FedRep(RI) vs FedRep on the grid k x M x N (FLUTE Fig. 3, App. C.1).

Setting of the paper: d = 10, Phi = U Lambda V^T with Lambda_ii = 2d - i + 1, x ~ N(0, I),
label noise of variance 0.3, eta = 0.03, FLUTE's init N(0, alpha^2) with alpha = 1/(10d),
k in {2, 4, 6, 8}, M in {15, 30}, N in {12, 20}. Our choices (the paper gives none): the
1/(2N) loss normalisation (with Algorithm 1's literal 1/N, eta = 0.03 diverges: try
`--set loss=mean`), eta_r = eta_l, gamma1 = 1/4, gamma2 = 1/8 (Theorem 5.1), the same eta
for the representation step of FedRep and FedRep(RI), 1000 rounds, 5 seeds. Every plot
shows the rank-k floor (1/M) sum ||(Phi_k)_i - phi_i||. `--quick`: 300 rounds, k in {4, 8},
M = 15 (4 of the 16 cells: each cell of k x M is its own program).
"""

import dataclasses

from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.flute import common as fc
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(fc.GridConfig):
  rep_dim: tuple = cfg.positive_int("representation dimensions k (rows of panels)",
                                    (2, 4, 6, 8), sequence=True)
  num_clients: tuple = cfg.positive_int("numbers of clients M", (15, 30), sequence=True)
  samples_per_client: tuple = cfg.positive_int("samples per client N", (12, 20), sequence=True)


def grid(config: Config) -> dict:
  return {"rep_dims": config.rep_dim, "client_counts": config.num_clients,
          "samples": config.samples_per_client}


def run(config: Config, seeds: int, batch) -> list[dict]:
  return fc.run_grid(config, seeds, batch, **grid(config))


def plot(rows, config: Config, file, figure: str = "FLUTE Fig. 3") -> None:
  fc.grid_figure(rows, config, file, **grid(config),
                 title=f"{figure}: d={config.dim}, {config.spectrum} models, "
                       f"eta={config.lr}, {config.loss} loss")


RECIPE = register(Recipe(
    name="flute-fig3",
    rank=80,
    docs="docs/papers/flute.md",
    summary="FLUTE Fig. 3: model error vs rounds, FLUTE vs FedRep(RI) vs FedRep, k x M x N grid",
    config=Config, quick={"rounds": 300, "rep_dim": (4, 8), "num_clients": (15,)}, run=run,
    plot=plot, default_seeds=5))
