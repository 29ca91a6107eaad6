"""fedrep-fig4: error of new clients that fit only a head on the learned B (FedRep Fig. 4).

FedRep and FedAvg are trained on n=100 clients with d=20, k=2 as in Fig. 1 (fixed local data
of m samples). A new client then gets m_new labelled samples, fits only its head by least
squares on the learned representation (minimum-norm when m_new < k), and is tested on fresh
samples; local only fits all of R^d from the m_new samples. Each new client's samples for a
larger m_new extend those for a smaller one (the same clients throughout). Our choices (the
paper gives none): m=10, r=0.1, T=300, lr=0.1, FedAvg with 10 local steps from a random
orthonormal B (`fedavg_init=moments` starts it from FedRep's method of moments instead), 100
new clients with 500 test samples each, the same new clients for every algorithm.
"""

import dataclasses
import functools

import jax
import numpy as np

from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.linear import local as local_lib
from fedjax_rep.linear.algorithms import make_algorithm
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import placement
from fedjax_rep.recipes.kit import linear
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.kit import shared
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(linear.Baselines):
  new_client_samples: tuple = cfg.positive_int(
      "samples m_new of each new client (x-axis)", (1, 2, 3, 4, 5, 7, 10, 15, 20, 25, 30, 40),
      sequence=True)
  new_clients: int = cfg.positive_int("number of new clients averaged over", 100)
  test_samples: int = cfg.positive_int("test samples per new client", 500)


@jax.jit(static_argnames=("sample_counts", "num_clients", "test_samples"))
def new_client_errors(keys, B, B_star, noise_std, sample_counts, num_clients, test_samples):
  """new_client_error [S, len(sample_counts)] for every seed: keys [S], B [S, d, k] or None."""
  return jax.vmap(functools.partial(local_lib.new_client_error, sample_counts=sample_counts,
                                    num_clients=num_clients, test_samples=test_samples),
                  in_axes=(0, None if B is None else 0, 0, None))(keys, B, B_star, noise_std)


def run(config: Config, seeds: int, batch) -> list[dict]:
  seed_values = config.seed_values(seeds)
  keys = shared.seed_keys(config.seed, seeds)
  data = linear.seed_data(keys, num_clients=config.num_clients, dim=config.dim,
                          rep_dim=config.rep_dim, noise_std=config.noise_std,
                          samples=config.samples_per_client)
  new_client_keys = jax.vmap(lambda k: jax.random.fold_in(k, 4))(keys[:, 0])
  cohort = cohort_size(config.num_clients, config.participation)
  rows = []
  for name in config.algorithms:
    B = None
    if name != "local":
      algorithm = placement.linear(make_algorithm(
          name, rep_dim=config.rep_dim, cohort=cohort, local_steps=config.fedavg_local_steps,
          init_method=config.fedavg_init if name == "fedavg" else "moments",
          kernel=config.kernel if name == "fedrep" else "xla"), config)
      metrics = shared.trained(batch, algorithm, data, linear.hparams(config), keys,
                               config.rounds,
                               members=shared.members(name, seed_values))
      B = metrics.pop("B")
      rows += shared.round_rows(name, seed_values, metrics)
    errors = batch.unit(f"{name}-new", lambda: {"new_client_error": np.asarray(new_client_errors(
        new_client_keys, B, data.B_star, config.noise_std, config.new_client_samples,
        config.new_clients, config.test_samples))})["new_client_error"]
    if name != "local":
      errors = shared.nan_where_diverged(errors, metrics)
    final_round = 0 if name == "local" else config.rounds
    for s, seed_value in enumerate(seed_values):
      for j, m_new in enumerate(config.new_client_samples):
        rows.append({"algorithm": name, "seed": seed_value, "round": final_round,
                     "new_client_samples": m_new, "new_client_error": float(errors[s, j])})
  return rows


def plot(rows, config: Config, file) -> None:
  plotting.one_panel(rows, "new_client_samples", "new_client_error", config.algorithms, file,
                     xlabel="new client's samples m_new", ylabel="new-client test MSE",
                     title=f"FedRep Fig. 4: d={config.dim}, k={config.rep_dim}",
                     vline=(config.rep_dim, "m_new = k"))


RECIPE = register(Recipe(
    name="fedrep-fig4",
    rank=30,
    docs="docs/papers/fedrep.md",
    summary="FedRep Fig. 4: new clients fit only a head on the learned representation",
    config=Config, quick={"rounds": 150, "new_client_samples": (1, 2, 3, 5, 10, 20, 40)},
    run=run, plot=plot, default_seeds=3))
