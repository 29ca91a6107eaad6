"""centaur-tradeoff: the privacy-utility tradeoff of CENTAUR (Shen et al., ICLR 2023): test
accuracy against the user-level ε for CENTAUR, DP-FedAvg-FT and local only.

CENTAUR is FedRep under user-level DP (`nn.privacy`): the representation's updates are
clipped and noised, the heads never leave the clients. DP-FedAvg-FT clips and noises the
whole model's updates and fine-tunes the head before each evaluation. Each ε in `epsilons`
calibrates its noise multiplier for `rounds` rounds (every ε of both methods is one compiled
program). The authors' choices (their code's EMNIST-D tradeoff scripts): full participation,
15 head epochs + 2 body epochs, SGD with momentum 0.9 and no weight decay, clip 0.1
(CENTAUR) and 0.2 (DP-FedAvg-FT), δ = 1e-5. Offline the data are scikit-learn's digits (MLP
64-64-32 + head) over 200 clients of 5 class shards, lr 0.05 (docs/papers/centaur.md: what
differs from the paper and what reproduces). The summary is, per method and ε, the mean over
seeds of each seed's mean of its last 10 evaluations.
"""

import dataclasses

import numpy as np

from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.experiments import plotting
from fedjax_rep.experiments.recipe_registry import Recipe, register
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import partitioned
from fedjax_rep.recipes.kit import summaries

# The methods: (name in rows and figures, the neural algorithm it runs, its clip field).
METHODS = (("centaur", "fedrep", "centaur_clip"),
           ("dp-fedavg-ft", "fedavg-ft", "fedavg_clip"),
           ("local", "local", None))
# The authors' plotting script (plot_utility_privacy_tradeoff.py): mean test accuracy (%)
# over 3 runs at each ε, EMNIST-D, N = 2000 clients of S = 5 classes; local only is flat.
PAPER_EPSILONS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)
PAPER = {"centaur": (65.64, 77.40, 91.80, 92.79, 92.98, 92.96),
         "dp-fedavg-ft": (57.25, 75.60, 84.69, 86.85, 87.09, 87.14),
         "local": (90.67,) * 6}
FIXED = ("dp_epsilon", "dp_noise", "dp_clip")  # set here per method and ε, not by a user


@dataclasses.dataclass(frozen=True)
class Config(partitioned.Partitioned):
  num_clients: int = cfg.num_clients(200)
  classes_per_client: int = neural.classes_per_client(5)
  participation: float = cfg.participation(1.0)
  head_epochs: int = neural.head_epochs(15)
  local_epochs: int = neural.local_epochs(2)
  momentum: float = neural.momentum(0.9)
  weight_decay: float = neural.weight_decay(0.0)
  dp_delta: float | None = neural.dp_delta(1e-5)
  epsilons: tuple = cfg.setting((0.25, 0.5, 1.0, 2.0, 4.0),
                                cfg.Check(float, low=0.0, open_low=True, sequence=True),
                                "the user-level ε of each point of the tradeoff (each "
                                "calibrates its noise multiplier for the run's rounds)")
  centaur_clip: float = cfg.positive_float("CENTAUR's clip of each client's representation "
                                           "update (L2 norm)", 0.1)
  fedavg_clip: float = cfg.positive_float("DP-FedAvg-FT's clip of each client's model "
                                          "update (L2 norm)", 0.2)
  algorithms: tuple = ("fedrep", "fedavg-ft", "local")

  def private(self) -> bool:
    """Whether this configuration asks for user-level DP: at each of `epsilons` (a
    method's configuration, `method`, at its own ε)."""
    return bool(self.epsilons) or super().private()

  def check(self):
    """The data's checks (`Partitioned.check`), and no ε, noise or clip of the generic DP
    keys: this recipe sets them per method and ε."""
    super().check()
    for name in FIXED:
      if getattr(self, name) is not None:
        raise cfg.ConfigError(f"centaur-tradeoff sets {name} itself, per method and ε: give "
                              f"--set epsilons=... (and centaur_clip, fedavg_clip) instead")

  def method(self, clip_field: str | None, epsilon: float | None = None) -> "Config":
    """This configuration for one method: DP at `epsilon` with its clip, or none (local)."""
    if clip_field is None:
      return dataclasses.replace(self, epsilons=(), dp_delta=None, dp_sampling="cohort",
                                 dp_accountant=None)
    return dataclasses.replace(self, epsilons=(), dp_clip=getattr(self, clip_field),
                               dp_epsilon=epsilon)

  def privacy_records(self, swept: cfg.Sweep) -> dict:
    """config.json's "privacy": each private method's record at each ε
    (`neural.privacy_record`), {method: {"ε=E": record}}."""
    del swept
    return {name: {f"ε={e:g}": neural.privacy_record(self.method(clip, e))
                   for e in self.epsilons}
            for name, _, clip in METHODS if clip is not None}


def run(config: Config, seeds: int, batch, grid=None) -> list[dict]:
  del grid  # (no traced keys)
  seed_values = config.seed_values(seeds)
  clients = partitioned.data(config, seed_values)
  model = neural.dataset_model(config.dataset, clients.input_spec(runs=1).shape,
                               config.precision, config.model)
  keys = neural.run_keys(seed_values)
  rows = []
  for name, algorithm, clip in METHODS:
    points = [None] if clip is None else list(config.epsilons)
    results = neural.trained(
        batch, name, algorithm, config.method(clip), model, clients, keys,
        config.num_clients, None if clip is None else [{"dp_epsilon": e} for e in points],
        runs=[{"seed": s} for s in seed_values])
    for epsilon, result in zip(points, results):
      rows += summaries.rows(name, seed_values, result,
                             target_epsilon=float("nan") if epsilon is None else epsilon)
  return rows


def method_rows(rows, name: str, clip_field: str | None, epsilon: float) -> list[dict]:
  """The rows of method `name` at ε `epsilon` (all of its rows for local only, trained once
  without DP: clip_field None)."""
  return [r for r in rows if r["algorithm"] == name and (
      clip_field is None or r["target_epsilon"] == epsilon)]


def points(rows, config: Config) -> list[dict]:
  """One row per (method, ε, seed): the seed's statistic of its test accuracies
  (`summaries.summary`), for the figure; local only (trained without DP) at every ε."""
  out = []
  for name, _, clip in METHODS:
    for epsilon in config.epsilons:
      own = method_rows(rows, name, clip, epsilon)
      for seed in sorted({r["seed"] for r in own}):
        (row,) = summaries.summary([r for r in own if r["seed"] == seed], [name],
                                   config.summary)
        out.append({"algorithm": name, "seed": seed, "target_epsilon": epsilon,
                    "test_accuracy": row["test_accuracy"]})
  return out


def plot(rows, config: Config, file) -> None:
  fig, (ours, paper) = plotting.figure(2, width=4.8, height=3.6)
  for i, (name, _, _) in enumerate(METHODS):
    plotting.line(ours, points(rows, config), "target_epsilon", "test_accuracy",
                  labels.label(name), style={"color": f"C{i}"}, algorithm=name)
    paper.plot(PAPER_EPSILONS, np.array(PAPER[name]) / 100, marker="o", ms=3,
               color=f"C{i}", label=labels.label(name))
  for ax, ticks in ((ours, config.epsilons), (paper, PAPER_EPSILONS)):
    ax.set_xscale("log")
    ax.set_xticks(ticks, [format(t, "g") for t in ticks])
    ax.minorticks_off()
  delta = neural.delta(config, neural.training_count(config, config.num_clients))
  ours.set(xlabel=f"user-level ε (δ = {delta:.3g})".replace("e-0", "e-"),
           ylabel="test accuracy (" + summaries.averaged_text(rows, config.summary) + ")",
           title=f"{config.dataset}: n={config.num_clients}, {config.classes_per_client} "
                 f"classes/client, {config.rounds} rounds")
  paper.set(xlabel="user-level ε (δ = 1e-5)", ylabel="test accuracy",
            title="the paper's (authors' plot data): EMNIST-D, n=2000, 5 classes/client")
  fig.suptitle(f"CENTAUR vs DP-FedAvg-FT vs local only: r={config.participation}, "
               f"{config.head_epochs}+{config.local_epochs} epochs, clip "
               f"{config.centaur_clip:g} / {config.fedavg_clip:g}")
  plotting.save(fig, file)


def summarize(rows, config: Config):
  """Per method and ε: `summaries.summary` of its rows, with target_epsilon (the ε asked
  for) and dp_epsilon (the ε spent; none for local only, trained without DP)."""
  table = []
  for epsilon in config.epsilons:
    for name, _, clip in METHODS:
      (row,) = summaries.summary(method_rows(rows, name, clip, epsilon), [name],
                                 config.summary)
      table.append({"algorithm": name, "target_epsilon": epsilon, **row})
  return table


RECIPE = register(Recipe(
    name="centaur-tradeoff",
    rank=125,
    docs="docs/papers/centaur.md",
    summary="CENTAUR's privacy-utility tradeoff on sklearn digits (offline): test accuracy "
            "vs user-level ε, CENTAUR, DP-FedAvg-FT, local only",
    config=Config, quick={"rounds": 30, "eval_every": 10}, run=run, plot=plot, default_seeds=3,
    summarize=summarize, summary_only=summaries.COST, privacy=True))
