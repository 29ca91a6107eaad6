"""flute-fig1: FLUTE vs FedRep vs FedRep(RI), model error vs rounds for several k (FLUTE
Fig. 1, Section 7.1).

Setting of the paper: phi_i ~ N(0, I_d) (Gaussian ground-truth models), x ~ N(0, I), label
noise, FLUTE's init N(0, alpha^2) with alpha = 1/(10d); FedRep starts from the method of
moments, FedRep(RI) from FLUTE's random init. The paper does not give d, M, N, the noise or
eta for this figure; we use App. C.1's d = 10, noise variance 0.3, eta = 0.03, with M = 30,
N = 20, and the 1/(2N) loss (see flute-fig3).
"""

import dataclasses

from fedjax_rep.linear import underparam
from fedjax_rep.recipes import config as cfg
from fedjax_rep.recipes import flute_common as fc
from fedjax_rep.recipes import linear_common as common
from fedjax_rep.recipes.registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(fc.GridConfig):
  spectrum: str = cfg.choice("ground-truth models: gaussian (phi_i ~ N(0, I), Sec. 7.1), or "
                             "Phi = U Lambda V^T with a linear / geometric spectrum",
                             "gaussian", underparam.SPECTRA)
  rep_dim: tuple = cfg.positive_int("representation dimensions k, one panel each",
                                    (2, 4, 6, 8), sequence=True)
  num_clients: int = common.num_clients(30)
  samples_per_client: int = common.samples_per_client(20)


def grid(config: Config) -> dict:
  return {"rep_dims": config.rep_dim, "client_counts": (config.num_clients,),
          "samples": (config.samples_per_client,)}


def run(config: Config, seeds: int, unit, progress: bool = True) -> list[dict]:
  return fc.run_grid(config, seeds, unit, progress, **grid(config))


def plot(rows, config: Config, file) -> None:
  fc.grid_figure(rows, config, file, **grid(config),
                 title=f"FLUTE Fig. 1: d={config.dim}, {config.spectrum} models, "
                       f"eta={config.lr}, {config.loss} loss")


RECIPE = register(Recipe(
    name="flute-fig1",
    summary="FLUTE Fig. 1: model error vs rounds, FLUTE vs FedRep vs FedRep(RI), several k",
    config=Config, quick={"rounds": 300}, run=run, plot=plot, default_seeds=5))
