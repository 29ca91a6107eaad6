"""fedavg-ft-fig3: D-GD reaches a stationary point of the global loss, FedAvg does not (left),
yet FedAvg's model fine-tunes better on new clients (right) (FedAvg-FT Fig. 3).

Training: see `fedavg_ft_common` (FedAvg with tau=2 vs D-GD, lr 0.2). Left: norm of the
gradient of the global objective (mean of the clients' losses) at the global model, per
round. Right: after training, 100 new clients with N(0, I_k) heads each get n samples
(x ~ N(0, I_d), label noise N(0, 0.01)), fine-tune B and w by 200 full-batch GD steps, and
we report ||B w - B* w*||^2 averaged over them, vs n. Our choice (the paper gives none):
fine-tuning step size 0.02 (0.05 diverges at n = 5 for FedAvg's model); 5000 rounds, since
D-GD's gradient norm falls linearly but at a rate that varies across seeds (below 2e-6 by
round 5000 for 9 of 10 seeds, 1e-4 for the slowest).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.linear import local as local_lib
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.recipes.fedavg_ft import common as ft
from fedjax_rep.recipes.kit import linear
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.kit import shared
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(ft.TrainingConfig):
  rounds: int = cfg.rounds(5000)
  local_steps: tuple = cfg.positive_int("local steps tau to compare (1 = D-GD)", (1, 2),
                                        sequence=True)
  finetune_samples: tuple = cfg.positive_int("samples n of each new client (x-axis)",
                                             (5, 10, 20, 50, 100, 200, 500), sequence=True)
  finetune_steps: int = cfg.positive_int("GD steps tau' of the new clients' fine-tuning", 200)
  finetune_lr: float = cfg.lr(0.02, "step size of the fine-tuning GD steps")
  finetune_noise_std: float = linear.noise_std(0.1)
  new_clients: int = cfg.positive_int("number of new clients averaged over", 100)


@jax.jit(static_argnames=("sample_counts", "num_clients", "steps"))
def fine_tune_errors(keys, B, w, B_star, noise_std, lr, sample_counts, num_clients, steps):
  """fine_tune_error [seeds, len(sample_counts)] for every seed."""
  return jax.vmap(functools.partial(local_lib.fine_tune_error, sample_counts=sample_counts,
                                    num_clients=num_clients, steps=steps),
                  in_axes=(0, 0, 0, 0, None, None))(keys, B, w, B_star, noise_std, lr)


def run(config: Config, seeds: int, batch) -> list[dict]:
  seed_values = config.seed_values(seeds)
  keys = shared.seed_keys(config.seed, seeds)
  new_client_keys = jax.vmap(lambda k: jax.random.fold_in(k, 4))(keys[:, 0])
  rows = []
  for tau in config.local_steps:
    name, data, trained = ft.train(config, keys, tau, batch)
    B, w = trained.pop("B"), trained.pop("w")
    rows += shared.round_rows(name, seed_values, trained, local_steps=tau)
    errors = batch.unit(f"{name}-finetune", lambda: {"finetune_error": np.asarray(fine_tune_errors(
        new_client_keys, jnp.asarray(B), jnp.asarray(w), data.B_star,
        config.finetune_noise_std, jnp.float32(config.finetune_lr), config.finetune_samples,
        config.new_clients, config.finetune_steps))})["finetune_error"]
    errors = shared.nan_where_diverged(errors, trained)
    for s, seed_value in enumerate(seed_values):
      for j, n in enumerate(config.finetune_samples):
        rows.append({"algorithm": name, "seed": seed_value, "round": config.rounds,
                     "local_steps": tau, "finetune_samples": n,
                     "finetune_error": float(errors[s, j])})
  return rows


def plot(rows, config: Config, file) -> None:
  fig, (left, right) = plotting.figure(2, width=5.0)
  training = [r for r in rows if "finetune_samples" not in r]
  for tau in config.local_steps:
    name = ft.algorithm_name(tau)
    label = labels.label(name)
    plotting.line(left, training, "round", "global_grad_norm", label, algorithm=name)
    plotting.line(right, rows, "finetune_samples", "finetune_error", label, algorithm=name)
  left.set(yscale="log", xlabel="communication round", ylabel="global gradient norm",
           title="stationarity of the global objective")
  right.set(xscale="log", yscale="log", xlabel="new client's samples n",
            ylabel=r"$\|Bw-B^*w^*\|^2$ after fine-tuning", title="fine-tuning on new clients")
  fig.suptitle(f"FedAvg-FT Fig. 3: d={config.dim}, k={config.rep_dim}, M={config.num_clients}")
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="fedavg-ft-fig3",
    rank=50,
    docs="docs/papers/fedavg_ft.md",
    summary="FedAvg-FT Fig. 3: global gradient norm vs rounds; new-client fine-tuning error vs n",
    config=Config, quick={"rounds": 3000, "finetune_samples": (5, 20, 100, 500)}, run=run,
    plot=plot, default_seeds=10))
