"""fedrep-fig1: test error vs samples per client, local only vs FedAvg vs FedRep (FedRep Fig. 1).

Setting of the paper: d=20, k=2, n=100, x ~ N(0, I), label noise variance 1e-3, fixed local
datasets of m samples for m on the x-axis. Our choices (the paper gives none): r=0.1, T=300
rounds, lr=0.1, FedAvg with 10 local GD steps from a random orthonormal B (the method-of-
moments start is part of FedRep; `fedavg_init=moments` gives it to FedAvg too), 100 held-out
test samples per client. Test error is the mean squared error (noise included) of each
client's personal model on its held-out samples: FedRep's is (B, head refitted on the
client's data), FedAvg's the global model, local only's the client's own least-squares fit
(minimum-norm when m < d).
"""

import dataclasses

import jax
import numpy as np

from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.linear import local as local_lib
from fedjax_rep.linear import metrics as metrics_lib
from fedjax_rep.linear.algorithms import make_algorithm
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import placement
from fedjax_rep.recipes.kit import linear
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.kit import shared
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(linear.Baselines):
  samples_per_client: tuple = cfg.positive_int("samples per client m (x-axis)",
                                               (5, 10, 15, 20, 30, 40, 60), sequence=True)
  test_samples: int = cfg.positive_int("held-out test samples per client", 100)


@jax.jit
def local_test_error(data):
  """Test error of local-only models for data with a leading seed axis: [seeds]."""
  return jax.vmap(lambda d: metrics_lib.mean_squared_error(
      local_lib.local_models(d.X, d.y), d.X_test, d.y_test))(data)


def run(config: Config, seeds: int, batch) -> list[dict]:
  seed_values = config.seed_values(seeds)
  keys = shared.seed_keys(config.seed, seeds)
  cohort = cohort_size(config.num_clients, config.participation)
  rows = []
  for m in config.samples_per_client:
    data = linear.seed_data(keys, num_clients=config.num_clients, dim=config.dim,
                            rep_dim=config.rep_dim, noise_std=config.noise_std, samples=m,
                            test_samples=config.test_samples)
    for name in config.algorithms:
      if name == "local":
        metrics = batch.unit(f"local-m{m}", lambda: {"test_error": np.asarray(
            local_test_error(data))[:, None]})
        rows += [dict(row, round=0) for row in shared.round_rows(
            name, seed_values, metrics, samples_per_client=m)]
        continue
      algorithm = placement.linear(make_algorithm(
          name, rep_dim=config.rep_dim, cohort=cohort, local_steps=config.fedavg_local_steps,
          init_method=config.fedavg_init if name == "fedavg" else "moments",
          kernel=config.kernel if name == "fedrep" else "xla"), config)
      metrics = batch.train(
          f"{name}-m{m}", algorithm, data, [linear.hparams(config)], shared.run_keys(keys),
          config.rounds, desc=f"{name} m={m}",
          members=[shared.members(name, seed_values, samples_per_client=m)])[0]["metrics"]
      rows += shared.round_rows(name, seed_values, metrics, samples_per_client=m)
  return rows


def final_rows(rows, rounds):
  """Rows of the last round (local-only rows have round 0)."""
  return [r for r in rows if r["round"] in (0, rounds)]


def plot(rows, config: Config, file) -> None:
  plotting.one_panel(final_rows(rows, config.rounds), "samples_per_client", "test_error",
                     config.algorithms, file, xlabel="samples per client m", ylabel="test MSE",
                     title=f"FedRep Fig. 1: n={config.num_clients}, d={config.dim}, "
                     f"k={config.rep_dim}")


RECIPE = register(Recipe(
    name="fedrep-fig1",
    rank=10,
    docs="docs/papers/fedrep.md",
    summary="FedRep Fig. 1: test error vs samples per client, local only vs FedAvg vs FedRep",
    config=Config, quick={"samples_per_client": (5, 10, 20, 40), "rounds": 150}, run=run,
    plot=plot, default_seeds=3))
