"""What the linear recipes share: configuration fields, hparams and seeded problem data."""

import dataclasses
import sys

import jax
import numpy as np

from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core.padding import PaddedData
from fedjax_rep.linear import data_modes
from fedjax_rep.linear import memory
from fedjax_rep.linear import problem as problem_lib
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import placement

NOISE_STD = 1e-3 ** 0.5  # FedRep Section 5.1: label noise of variance 1e-3
PRINT_ESTIMATE_BYTES = 2 << 30  # runs that need more print their memory estimate first


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


def kernel(default="xla"):
  return cfg.choice("how FedRep's rounds run: xla (the same bits on every machine) or "
                    "native (opt-in C++ kernel built with the machine's compiler; needs "
                    "participation=1)", default, ("xla", "native"))


def check_kernel(config):
  """With kernel=native: full participation, and the kernel built here (once per machine)
  before any work; a ConfigError saying why not otherwise."""
  if config.kernel == "xla":
    return
  if config.participation < 1:
    raise cfg.ConfigError(f"kernel=native runs FedRep's rounds with full participation only: "
                          f"set participation=1 (got {config.participation}) or kernel=xla")
  from fedjax_rep import native  # only here: the default never touches the compiler
  from fedjax_rep.native import fedrep_round
  try:
    fedrep_round.load(fedrep_round.FIXED)
  except native.NativeUnavailable as error:
    raise cfg.ConfigError(f"kernel=native: {error}") from None


def fedavg_init(default="random"):
  return cfg.choice("FedAvg's initial B: random (standard FedAvg) or FedRep's method of "
                    "moments", default, ("random", "moments"))


@dataclasses.dataclass(frozen=True)
class Problem(cfg.Config):
  """Fields of every linear recipe: the problem (n clients, d, k, m samples per client,
  label noise), rounds, step size and seed."""
  num_clients: int = cfg.num_clients(100)
  dim: int = dim(10)
  rep_dim: int = rep_dim(2)
  samples_per_client: int = samples_per_client(5)
  rounds: int = cfg.rounds(200)
  lr: float = cfg.lr(0.1)
  noise_std: float = noise_std()
  seed: int = cfg.seed()


@dataclasses.dataclass(frozen=True)
class Sampled(Problem):
  """A `Problem` whose rounds sample a fraction `participation` of the clients."""
  participation: float = cfg.participation(0.1)

  def check(self):
    check_rep_dim(self)


@dataclasses.dataclass(frozen=True)
class Baselines(Sampled):
  """A `Sampled` problem on which FedRep is compared with local only and FedAvg (FedRep
  Figs. 1 and 4): d = 20, m = 10, 300 rounds."""
  SHARDED_ALGORITHMS = placement.LINEAR_SHARDED
  dim: int = dim(20)
  samples_per_client: int = samples_per_client(10)
  rounds: int = cfg.rounds(300)
  fedavg_local_steps: int = cfg.positive_int("local GD steps of FedAvg per round", 10)
  fedavg_init: str = fedavg_init()
  algorithms: tuple = cfg.choice("algorithms to compare", FEDREP_BASELINES, FEDREP_BASELINES,
                                 sequence=True)
  kernel: str = kernel()

  def check(self):
    check_rep_dim(self)
    check_kernel(self)

  def code_record(self) -> dict:
    """What config.json records of the kernel path that runs: {"kernel": "xla"}, or
    "native" with its build's file name (`fedjax_rep.native.build_key`) where `kernel` asks
    for the C++ kernel."""
    if self.kernel == "xla":
      return super().code_record()
    from fedjax_rep.native import fedrep_round  # only here: the default never touches it
    return {"kernel": "native", "kernel_build": fedrep_round.build_key()}


def hparams(config) -> LinearHparams:
  """The step sizes of `config` (`lr`, of B and of the heads), placed on the device."""
  return jax.device_put(LinearHparams(  # numpy scalars placed: no device program compiles
      lr=np.float32(config.lr), head_lr=np.float32(config.lr)))


def seed_data(keys, *, num_clients, dim, rep_dim, noise_std, samples=0, test_samples=0,
              mode="fixed", normalize_heads=True):
  """Problem and client data for every seed (leading seed axis), from keys [seeds, 3].

  mode 'fixed': fixed local datasets of `samples` (+ `test_samples` held out) per client;
  'fresh': `samples` fresh samples per client every round; 'population': population losses.
  One compiled program per shape: noise_std and the keys are traced. Checks first that
  the runs fit in memory (`memory.check`: a ConfigError naming the sizes if not), and
  prints the estimate when it is over PRINT_ESTIMATE_BYTES.
  """
  if mode in ("fixed", "fresh"):
    try:  # the seeds run as one program: count their clients together
      parts = memory.check(num_clients * keys.shape[0], dim, rep_dim, max(samples, 1), mode,
                           test_samples=test_samples)
    except ValueError as error:
      raise cfg.ConfigError(f"{keys.shape[0]} seeds of {num_clients} clients run together: "
                            f"{error}") from None
    if parts["total"] > PRINT_ESTIMATE_BYTES:
      print(f"memory estimate, {keys.shape[0]} seeds x {num_clients} clients: "
            f"{memory.describe(parts)}", file=sys.stderr)
  return _seed_data(keys, np.float32(noise_std), num_clients=num_clients,
                    dim=dim, rep_dim=rep_dim, samples=samples, test_samples=test_samples,
                    mode=mode, normalize_heads=normalize_heads)


# Run once per recipe, so compiled for compile time (a quarter of the default's) rather than
# speed; its numbers differ from the default's by float32 rounding.
@jax.jit(static_argnames=("num_clients", "dim", "rep_dim", "samples", "test_samples",
                          "mode", "normalize_heads"),
         compiler_options={"xla_backend_optimization_level": 0})
def _seed_data(keys, noise_std, *, num_clients, dim, rep_dim, samples, test_samples, mode,
               normalize_heads):
  def one(key_problem, key_data):
    problem = problem_lib.make_problem(key_problem, num_clients, dim, rep_dim, noise_std,
                                       normalize_heads)
    if mode == "population":
      return data_modes.PopulationData(problem)
    if mode == "fresh":
      return data_modes.FreshData(problem, samples)
    return data_modes.make_fixed_data(key_data, problem, samples, test_samples)

  return jax.vmap(one)(keys[:, 0], keys[:, 1])


def padding_groups(client_counts, mode="fixed") -> list[tuple[int, ...]]:
  """The client counts that share one padded program: with fixed data, those whose cohorts
  `cohort.sample_padded` draws exactly as unpadded runs would (same shuffle rounds); fresh
  data are not padded (padding clients would draw samples), one count per group."""
  if mode != "fixed":
    return [(n,) for n in client_counts]
  groups = {}
  for n in client_counts:
    groups.setdefault(cohort_lib.shuffle_rounds(n), []).append(n)
  return [tuple(g) for g in groups.values()]


def zero_clients(data, n: int):
  """FixedData `data` (leading seed axis) with the data of clients >= n set to zero."""
  def zero(leaf):
    leaf = np.asarray(leaf)
    real = (np.arange(leaf.shape[1]) < n).reshape((1, -1) + (1,) * (leaf.ndim - 2))
    return np.where(real, leaf, 0).astype(leaf.dtype)

  return data.replace(**{name: zero(getattr(data, name))
                         for name in ("X", "y", "X_test", "y_test", "models")
                         if getattr(data, name) is not None})


def padded_seed_data(keys, client_counts, participation, *, mode="fixed", **problem):
  """PaddedData with runs [len(client_counts) * seeds] (count-major) of every seed of keys
  [seeds, 3] for every n in client_counts, padded to max(client_counts) clients.

  The real clients' data are exactly those of seed_data(keys, num_clients=n, ...) (per-client
  samples and heads do not depend on the number of clients); padding clients have zero
  data. `problem`: seed_data's keywords. Fresh data take one client count (no padding).
  """
  if mode != "fixed" and len(client_counts) > 1:
    raise ValueError("fresh data cannot be padded: pass one client count")
  max_clients = max(client_counts)
  data = seed_data(keys, num_clients=max_clients, mode=mode, **problem)
  seeds = keys.shape[0]
  padded = data if mode != "fixed" else jax.tree.map(
      lambda *leaves: np.concatenate(leaves), *[zero_clients(data, n) for n in client_counts])
  counts = np.repeat(np.asarray(client_counts, np.int32), seeds)
  cohorts = np.repeat(np.asarray([cohort_lib.cohort_size(n, participation)
                                  for n in client_counts], np.int32), seeds)
  return PaddedData(data=padded, active=counts, cohort=cohorts)
