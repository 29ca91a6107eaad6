"""What the linear recipes share: configuration fields, hparams and seeded problem data."""

import jax
import jax.numpy as jnp

from fedjax_rep.linear import problem as problem_lib
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.recipes import config as cfg

NOISE_STD = 1e-3 ** 0.5  # FedRep Section 5.1: label noise of variance 1e-3


def dim(default):
  return cfg.positive_int("data dimension d", default)


def rep_dim(default):
  return cfg.positive_int("representation dimension k (<= dim)", default)


def samples_per_client(default):
  return cfg.positive_int("samples per client m", default)


def noise_std(default=NOISE_STD):
  return cfg.nonnegative_float("standard deviation of the label noise", default)


def check_rep_dim(config):
  if config.rep_dim > config.dim:
    raise cfg.ConfigError(f"rep_dim={config.rep_dim} is out of range: rep_dim must be an "
                          f"integer in [1, dim={config.dim}] (k <= d)")


FEDREP_BASELINES = ("local", "fedavg", "fedrep")  # FedRep Figs. 1 and 4


def fedavg_init(default="random"):
  return cfg.choice("FedAvg's initial B: random (standard FedAvg) or FedRep's method of "
                    "moments", default, ("random", "moments"))


def hparams(config) -> LinearHparams:
  return LinearHparams(lr=jnp.float32(config.lr),
                       head_lr=jnp.float32(getattr(config, "head_lr", config.lr)))


def seed_data(keys, *, num_clients, dim, rep_dim, noise_std, samples=0, test_samples=0,
              mode="fixed", normalize_heads=True):
  """Problem and client data for every seed (leading seed axis), from keys [seeds, 3].

  mode 'fixed': fixed local datasets of `samples` (+ `test_samples` held out) per client;
  'fresh': `samples` fresh samples per client every round; 'population': population losses.
  """

  def one(key_problem, key_data):
    problem = problem_lib.make_problem(key_problem, num_clients, dim, rep_dim, noise_std,
                                       normalize_heads)
    if mode == "population":
      return problem_lib.PopulationData(problem)
    if mode == "fresh":
      return problem_lib.FreshData(problem, samples)
    return problem_lib.make_fixed_data(key_data, problem, samples, test_samples)

  return jax.jit(jax.vmap(one))(keys[:, 0], keys[:, 1])
