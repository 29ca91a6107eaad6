"""flute-fig1: FLUTE vs FedRep vs FedRep(RI), model error vs rounds for several k (FLUTE
Fig. 1, Section 7.1).

Setting of the paper: phi_i ~ N(0, I_d) (Gaussian ground-truth models), x ~ N(0, I), label
noise, FLUTE's init N(0, alpha^2) with alpha = 1/(10d); FedRep starts from the method of
moments, FedRep(RI) from FLUTE's random init. The paper does not give d, M, N, the noise or
eta for this figure; we use App. C.1's d = 10, noise variance 0.3, eta = 0.03, with M = 30,
N = 20, and the 1/(2N) loss (see flute-fig3).
"""

import dataclasses
import functools

from fedjax_rep.linear import underparam
from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.flute import fig3 as flute_fig3
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(flute_fig3.Config):
  spectrum: str = cfg.choice("ground-truth models: gaussian (phi_i ~ N(0, I), Sec. 7.1), or "
                             "Phi = U Lambda V^T with a linear / geometric spectrum",
                             "gaussian", underparam.SPECTRA)
  rep_dim: tuple = cfg.positive_int("representation dimensions k, one panel each",
                                    (2, 4, 6, 8), sequence=True)
  num_clients: tuple = cfg.positive_int("numbers of clients M", (30,), sequence=True)
  samples_per_client: tuple = cfg.positive_int("samples per client N", (20,), sequence=True)


RECIPE = register(Recipe(
    name="flute-fig1",
    rank=70,
    docs="docs/papers/flute.md",
    summary="FLUTE Fig. 1: model error vs rounds, FLUTE vs FedRep vs FedRep(RI), several k",
    config=Config, quick={"rounds": 300}, run=flute_fig3.run,
    plot=functools.partial(flute_fig3.plot, figure="FLUTE Fig. 1"), default_seeds=5))
