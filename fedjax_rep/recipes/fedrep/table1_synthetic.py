"""table1-synthetic: FedRep's Table-1 comparison on LEAF's Synthetic(alpha, beta), the
FedProx/LEAF federated benchmark that needs no download.

Each client k has its own softmax-regression model (W_k, b_k) and input mean v_k, drawn
with heterogeneity alpha (models) and beta (inputs) (`data.synthetic`); client sizes are
LEAF's log-normal ones, uncapped (`max_samples` caps them), held in a flat store
(`data.flat`: memory and work follow the real samples), 60-dimensional inputs, 10 classes. Settings
Synthetic(0,0), (0.5,0.5), (1,1), all run as one program per algorithm. Every algorithm
of FedRep's Table 1 trains the same MLP (`synthetic-mlp`, the body's last layer the
representation, the head the last layer) with FedRep's schedule (10 head epochs + 1
body epoch, r = 0.1, SGD momentum 0.5, weight decay 1e-4, batch 10); lr 0.05 (our
choice: the MLP on 60-d inputs). FedRep's paper has no synthetic column, so table1.csv
has no paper numbers here. `--quick`: 20 clients (their natural, uncapped sizes), 20
rounds, and the six algorithms that share one program (QUICK_ALGORITHMS); `--set
algorithms=...` adds the others.
"""

import dataclasses

from fedjax_rep.data import synthetic
from fedjax_rep.nn import models
from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import summaries
from fedjax_rep.recipes.kit import table
from fedjax_rep.recipes.fedrep import paper
from fedjax_rep.experiments.recipe_registry import Recipe, register

DATASET = "synthetic"
# --quick: the algorithms that share one program (`nn.program`), so it compiles once.
QUICK_ALGORITHMS = ("local", "fedavg", "fedavg-ft", "lg-fedavg", "fedper", "fedrep")


@dataclasses.dataclass(frozen=True)
class Config(table.Fields):
  algorithms: tuple = neural.algorithms(paper.DEFAULT_ALGORITHMS)
  num_clients: int = cfg.num_clients(100)
  alpha: tuple = cfg.setting((0.0, 0.5, 1.0), cfg.Check(float, low=0.0, sequence=True),
                             "model heterogeneity alpha of each setting")
  beta: tuple = cfg.setting((0.0, 0.5, 1.0), cfg.Check(float, low=0.0, sequence=True),
                            "input heterogeneity beta of each setting (paired with alpha)")
  max_samples: int | None = cfg.setting(
      None, cfg.Check(int, low=10, optional=True, auto="no cap: LEAF's natural sizes"),
      "cap on a client's samples (log-normal sizes)")
  test_fraction: float = cfg.setting(0.2, cfg.Check(float, low=0.0, high=0.5, open_low=True),
                                     "fraction of each client's samples held out for testing")
  lr: float = cfg.lr(0.05, "step size of local SGD")
  averaging: str | None = table.leaf_averaging()

  def check(self):
    table.check_paired(self, "alpha", "beta")


def settings(config: Config) -> list[dict]:
  return [{"num_clients": config.num_clients, "alpha": a, "beta": b}
          for a, b in zip(config.alpha, config.beta)]


def run(config: Config, seeds: int, batch, grid=None) -> list[dict]:
  def dataset(run):
    return synthetic.federated(run["alpha"], run["beta"], config.num_clients, run["seed"],
                               max_samples=config.max_samples,
                               test_fraction=config.test_fraction)

  model = models.make_model("synthetic-mlp", precision=config.precision)
  return table.run(config, seeds, batch, settings(config), dataset, model, grid)


def summarize(rows, config: Config):
  return table.table(rows, config, DATASET, settings(config), paper.PAPER)


def plot(rows, config: Config, file) -> None:
  table.plot(rows, config, file, DATASET, settings(config),
              f"Synthetic(alpha, beta): n={config.num_clients}, r={config.participation}, "
              f"{config.rounds} rounds, client sizes "
              + ("uncapped" if config.max_samples is None else
                 f"capped at {config.max_samples}"), paper.PAPER, "FedRep Table 1")


RECIPE = register(Recipe(
    name="table1-synthetic",
    rank=130,
    docs="docs/papers/fedrep.md#synthetic-table1-synthetic",
    summary="FedRep's Table-1 algorithms on LEAF's Synthetic(0,0), (0.5,0.5), (1,1) "
            "(offline); table1.csv",
    config=Config, quick={"num_clients": 20, "rounds": 20, "algorithms": QUICK_ALGORITHMS},
    run=run, plot=plot,
    default_seeds=3, summarize=summarize, summary_file="table1.csv",
    traced=neural.traced_keys, summary_only=summaries.COST, searchable=True,
    privacy=True))
