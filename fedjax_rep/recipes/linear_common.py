"""What the linear recipes share: configuration fields, seed sweeps and table rows."""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import loop
from fedjax_rep.linear import problem as problem_lib
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.recipes import config as cfg

NOISE_STD = 1e-3 ** 0.5  # FedRep Section 5.1: label noise of variance 1e-3


def dim(default):
  return cfg.positive_int("data dimension d", default)


def rep_dim(default):
  return cfg.positive_int("representation dimension k (<= dim)", default)


def num_clients(default):
  return cfg.positive_int("number of clients n", default)


def samples_per_client(default):
  return cfg.positive_int("samples per client m", default)


def rounds(default):
  return cfg.positive_int("communication rounds T", default)


def participation(default):
  return cfg.fraction("fraction r of clients sampled each round", default)


def lr(default, what="step size of the representation (and FedAvg) GD steps"):
  return cfg.positive_float(what, default)


def noise_std(default=NOISE_STD):
  return cfg.nonnegative_float("standard deviation of the label noise", default)


def seed(default=0):
  return cfg.positive_int("seed of the first run (later seeds count up)", default, low=0)


def check_rep_dim(config):
  if config.rep_dim > config.dim:
    raise cfg.ConfigError(f"rep_dim={config.rep_dim} is out of range: rep_dim must be an "
                          f"integer in [1, dim={config.dim}] (k <= d)")


FEDREP_BASELINES = ("local", "fedavg", "fedrep")  # FedRep Figs. 1 and 4


def fedavg_init(default="random"):
  return cfg.choice("FedAvg's initial B: random (standard FedAvg) or FedRep's method of "
                    "moments", default, ("random", "moments"))


def concatenate(trees):
  """Leafwise concatenation along the leading axis, on the host (small trees; no eager
  device ops, so nothing compiles)."""
  return jax.tree.map(lambda *x: np.concatenate([np.asarray(v) for v in x]), *trees)


def seed_keys(first_seed: int, seeds: int) -> jax.Array:
  """Keys [seeds, 3] (problem, data, run) of seeds first_seed, first_seed + 1, ..."""
  return jax.vmap(lambda s: jax.random.split(jax.random.key(s), 3))(
      jnp.arange(first_seed, first_seed + seeds))


def hparams(config) -> LinearHparams:
  return LinearHparams(lr=jnp.float32(config.lr),
                       head_lr=jnp.float32(getattr(config, "head_lr", config.lr)))


def run_seeds(algorithm, data, hparams, keys, num_rounds, progress=True, desc=None,
              hparams_axis=None):
  """Runs `algorithm` on every seed at once (one vmapped program); data has a seed axis
  (a leading sweep axis of runs), and so do hparams where hparams_axis=0."""
  return loop.run(algorithm, data, hparams, keys[:, 2], num_rounds,
                  sweep_axes=(0, hparams_axis, 0), progress=progress, desc=desc)


def trained(unit, algorithm, data, hparams, keys, num_rounds, progress, keep=("B",)):
  """Cached unit '<name>-train': metrics [seeds, rounds] of `run_seeds`, plus the final
  state's fields `keep` ([seeds, ...]) under their own names."""

  def compute():
    result = run_seeds(algorithm, data, hparams, keys, num_rounds, progress, desc=algorithm.name)
    return {**result.metrics, **{k: np.asarray(getattr(result.state, k)) for k in keep}}

  return unit(f"{algorithm.name}-train", compute)


def round_rows(algorithm: str, seeds: list[int], metrics: dict[str, np.ndarray], **columns):
  """Rows (algorithm, seed, round, **columns, metrics) of metrics [seeds, rounds].

  With a `diverged` metric (0/1 per round, from the loop) every row also gets
  `diverged_round`: the first round at which its run diverged, 0 if it never did.
  """
  rows = []
  num_rounds = next(iter(metrics.values())).shape[1]
  for s, seed_value in enumerate(seeds):
    extra = {}
    if "diverged" in metrics:
      flags = metrics["diverged"][s] > 0
      extra["diverged_round"] = int(np.argmax(flags)) + 1 if flags.any() else 0
    for t in range(num_rounds):
      rows.append({"algorithm": algorithm, "seed": seed_value, "round": t + 1, **columns,
                   **extra, **{name: float(v[s, t]) for name, v in metrics.items()}})
  return rows


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
