"""What the FedAvg-FT recipes share: the training configuration and the training runs.

Setting of the paper (FedAvg-FT Section 5): d=100, k=5, M=40 clients, all clients every round,
B* orthonormalised Gaussian, heads w_i* with N(0, 1) entries, population losses
f_i(B, w) = 1/2 ||B w - B* w_i*||^2, 10 runs. Our choices (the paper gives none), as Theorem 1
asks: step size alpha = lr = 0.2; B0 = Q / sqrt(alpha) with Q a random orthonormal d x k
matrix, so that ||I - alpha B0^T B0|| = 0 (sqrt(alpha) B0 orthonormal); w0 = 0 (small head).
At lr 0.1 the same orderings hold, only slower.
"""

import dataclasses

from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.linear.algorithms import make_algorithm
from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.kit import linear
from fedjax_rep.recipes.kit import shared


def algorithm_name(local_steps: int) -> str:
  """Registry name of FedAvg with `local_steps` local steps: 'd-gd' for one."""
  return "d-gd" if local_steps == 1 else f"fedavg-tau{local_steps}"


@dataclasses.dataclass(frozen=True)
class TrainingConfig(linear.Sampled):
  """The training part of a FedAvg-FT recipe's configuration."""
  UNSHARDED = "the linear FedAvg-FT"
  num_clients: int = cfg.num_clients(40)
  dim: int = linear.dim(100)
  rep_dim: int = linear.rep_dim(5)
  rounds: int = cfg.rounds(2000)
  participation: float = cfg.participation(1.0)
  lr: float = cfg.lr(0.2, "step size alpha of every local GD step")
  samples_per_client: int = linear.samples_per_client(100)
  noise_std: float = linear.noise_std(0.0)
  local_steps: tuple = cfg.positive_int("local steps tau to compare (1 = D-GD)", (1, 2, 5, 10),
                                        sequence=True)
  data_mode: str = cfg.choice("population losses, or fixed / fresh samples per client",
                              "population", ("population", "fixed", "fresh"))


def train(config, keys, local_steps: int, batch):
  """Runs FedAvg with `local_steps` on every seed; returns (name, data, metrics + final B
  and w)."""
  name = algorithm_name(local_steps)
  data = linear.seed_data(keys, num_clients=config.num_clients, dim=config.dim,
                          rep_dim=config.rep_dim, noise_std=config.noise_std,
                          samples=config.samples_per_client, mode=config.data_mode,
                          normalize_heads=False)
  algorithm = make_algorithm(name, rep_dim=config.rep_dim,
                             cohort=cohort_size(config.num_clients, config.participation),
                             init_method="random-scaled")
  return name, data, shared.trained(
      batch, algorithm, data, linear.hparams(config), keys, config.rounds,
      keep=("B", "w"), members=shared.members(name, config.seed_values(len(keys)),
                                              local_steps=local_steps))
