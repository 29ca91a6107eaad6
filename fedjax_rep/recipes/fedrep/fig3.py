"""fedrep-fig3: FedRep vs GD-GD vs 10GD-GD, principal angle distance vs rounds (FedRep Fig. 3).

Setting of the paper: d=10, k=2, m=5, r=0.1, n in {10, 100, 1000}, T=200, x ~ N(0, I),
label noise variance 1e-3, method-of-moments initialisation, heads start at zero.
Our choices (the paper gives none): lr = head_lr = 0.1 (GD-GD diverges at 0.25-0.5 with
m=5), and fixed local datasets of m samples (`data_mode=fixed`). With fixed data the total
number of samples n*m limits what can be learned, and n=10 (50 samples for ~36 unknowns)
does not converge, as in the paper's figure. With `data_mode=fresh` (Algorithm 2 as
written: m fresh samples per round) every n converges, n=10 included, only slower.
"""

import dataclasses

import numpy as np

from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.core.padding import Padded
from fedjax_rep.linear.fedrep import TRACED_HEAD_STEPS, FedRep
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.experiments import placement
from fedjax_rep.recipes.kit import linear
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.kit import shared
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(linear.Sampled):
  SHARDED_ALGORITHMS = placement.LINEAR_SHARDED
  num_clients: tuple = cfg.positive_int("numbers of clients n, one panel each", (10, 100, 1000),
                                        sequence=True)
  head_lr: float = cfg.lr(0.1, "step size of the head GD steps (GD-GD, 10GD-GD)")
  data_mode: str = cfg.choice("fixed local datasets, or fresh samples every round", "fixed",
                              ("fixed", "fresh"))
  algorithms: tuple = cfg.choice("algorithms to compare", ("fedrep", "gd-gd", "10gd-gd"),
                                 ("fedrep", "gd-gd", "10gd-gd"), sequence=True)


HEAD_STEPS = {"fedrep": 0, "gd-gd": 1, "10gd-gd": 10}  # head GD steps (0: exact heads)


def run(config: Config, seeds: int, batch, grid=None) -> list[dict]:
  """Rows of every algorithm, n and seed (and `grid` combination of traced keys: lr,
  head_lr). The algorithms differ only in a traced number (head steps) and the values of n
  are padded to a common client count, so each padding group is one compiled program;
  sharded (config.devices, config.cohort_groups), each n is its own program, unpadded."""
  seed_values = config.seed_values(seeds)
  keys = shared.seed_keys(config.seed, seeds)
  combos = grid or [{}]
  curves = {}
  # Sharded (devices, cohort groups), each n runs unpadded: the padded round is one device's.
  groups = ([(n,) for n in config.num_clients] if placement.sharded(config) else
            linear.padding_groups(config.num_clients, config.data_mode))
  for group in groups:
    data = linear.padded_seed_data(
        keys, group, config.participation, mode=config.data_mode, dim=config.dim,
        rep_dim=config.rep_dim, noise_std=config.noise_std, samples=config.samples_per_client)
    settings = [(c, name) for c in range(len(combos)) for name in config.algorithms]
    hparams = [LinearHparams(lr=np.float32(combos[c].get("lr", config.lr)),
                             head_lr=np.float32(combos[c].get("head_lr", config.head_lr)),
                             head_steps=np.int32(HEAD_STEPS[name])) for c, name in settings]
    algorithm = FedRep(rep_dim=config.rep_dim, head_steps=TRACED_HEAD_STEPS,
                       cohort=max(cohort_size(n, config.participation) for n in group))
    if placement.sharded(config):
      algorithm, data = placement.linear(algorithm, config), data.data
    else:
      algorithm = Padded(algorithm)
    label = "-".join(map(str, group))
    results = batch.train(
        f"n{label}", algorithm, data, hparams,
        shared.run_keys(keys, np.tile(np.arange(seeds), len(group))), config.rounds,
        desc=f"n={label}", members=[
            [m for n in group for m in shared.members(name, seed_values, **combos[c],
                                                      num_clients=n)]
            for c, name in settings])
    for (c, name), result in zip(settings, results):
      for i, n in enumerate(group):
        curves[c, name, n] = {k: v[i * seeds:(i + 1) * seeds]
                              for k, v in result["metrics"].items()}
  return [row for c, combo in enumerate(combos) for n in config.num_clients
          for name in config.algorithms
          for row in shared.round_rows(name, seed_values, curves[c, name, n], **combo,
                                       num_clients=n)]


def plot(rows, config: Config, file) -> None:
  fig, axes = plotting.figure(len(config.num_clients))
  for ax, n in zip(axes, config.num_clients):
    for name in config.algorithms:
      plotting.line(ax, rows, "round", "principal_angle", labels.label(name),
                    algorithm=name, num_clients=n)
    ax.set(yscale="log", title=f"n = {n}", xlabel="communication round",
           ylabel="principal angle distance")
  fig.suptitle(f"FedRep Fig. 3: d={config.dim}, k={config.rep_dim}, "
               f"m={config.samples_per_client}, r={config.participation}, "
               f"{config.data_mode} data")
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="fedrep-fig3",
    rank=20,
    docs="docs/papers/fedrep.md",
    summary="FedRep Fig. 3: principal angle vs rounds, FedRep vs GD-GD vs 10GD-GD, "
            "n in {10,100,1000}",
    config=Config, quick={"rounds": 100}, run=run, plot=plot, default_seeds=3,
    traced=("lr", "head_lr")))
