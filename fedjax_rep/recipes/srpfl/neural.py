"""srpfl-neural: test accuracy vs simulated wall-clock time of SRPFL on neural networks
(SRPFL Section 5 and Appendix C): FedRep, LG-FedAvg and FedAvg(+FT) with SRPFL's doubling
participation (SRPFL, LG-SRPFL, FLANP(+FT)) and without it, fixed and dynamic client
speeds, communication cost C in {0, 10, 100}, full and 20% participation.

Every round samples N = participation x M clients and keeps the fastest n_t, the others
masked (`hetero.timed.EvaluatedTimed`): n0 = n0_fraction x N, doubling every `stage_rounds`
(the baselines keep all N). A client's time per round is its speed draw (fixed: Exp(1) once
per client; dynamic: Exp(lambda_i) every round, lambda_i ~ U[1/M, 1]); a round lasts its
kept clients' largest, plus C, which changes no training, so each run is simulated once and
its clock for C is wall_clock + C t. Accuracy: the mean over the M clients of each client's
test accuracy with its own parameters (+FT: the global model, its head fine-tuned for
head_epochs). time_to_target: the first evaluation at or above target_fraction x FedRep's
final accuracy (FedRep always runs). Data: any registered dataset (`data.datasets`: digits,
the default, CIFAR-10/100, EMNIST, FEMNIST, yours); fields at 0 take its SETTINGS.
"""

import dataclasses

import numpy as np

from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.data import datasets, federated
from fedjax_rep.data import partition as partition_lib
from fedjax_rep.hetero import timed
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import algorithms as nn_algorithms
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import shared
from fedjax_rep.recipes.kit import summaries
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.srpfl import common as sc
from fedjax_rep.experiments.recipe_registry import Recipe, register

# algorithm -> (the neural algorithm it times, whether it follows SRPFL's doubling)
TIMED = {"srpfl": ("fedrep", True), "fedrep": ("fedrep", False),
              "lg-srpfl": ("lg-fedavg", True), "lg-fedavg": ("lg-fedavg", False),
              "flanp-ft": ("fedavg-ft", True), "fedavg-ft": ("fedavg-ft", False),
              "flanp": ("fedavg", True), "fedavg": ("fedavg", False)}
COLORS = {"fedrep": "tab:blue", "lg-fedavg": "tab:green", "fedavg-ft": "tab:red",
          "fedavg": "tab:orange"}  # by timed algorithm; doubling solid, all N dashed
QUICK_ALGORITHMS = ("srpfl", "fedrep", "lg-srpfl", "lg-fedavg", "flanp-ft", "fedavg-ft")

FEMNIST_SAMPLES = 150  # training samples per client (the paper: 15,000 over 100 clients)
# dataset -> the values of the fields left at 0 (the paper's; ours on digits), and the
# training samples per client the pool is cut to (samples_per_client; 0: all of them); any
# other dataset takes OTHER's.
SETTINGS = {
    "digits": dict(num_clients=50, classes_per_client=5, lr=0.05, local_epochs=1),
    "cifar10": dict(num_clients=100, classes_per_client=5, lr=0.01, local_epochs=1),
    "cifar100": dict(num_clients=100, classes_per_client=20, lr=0.01, local_epochs=5),
    "emnist": dict(num_clients=100, classes_per_client=5, lr=0.01, local_epochs=5),
    "femnist": dict(num_clients=100, classes_per_client=3, lr=0.01, local_epochs=5,
                    samples_per_client=FEMNIST_SAMPLES),
}
OTHER = dict(num_clients=100, classes_per_client=2, lr=0.01, local_epochs=1)


@dataclasses.dataclass(frozen=True)
class Config(sc.Panels, neural.Training):
  UNSHARDED = "SRPFL's timed schedules"
  participation: tuple = cfg.setting(
      (1.0, 0.2), cfg.Check(float, low=0.0, high=1.0, open_low=True, sequence=True),
      "fractions of the M clients sampled each round (N = participation x M), one row of "
      "panels each")
  local_epochs: int = cfg.positive_int("local epochs per round (FedRep: of the body; 0: the "
                                       "dataset's, 1 on digits and CIFAR-10, 5 on the "
                                       "paper's others, else 1)", 0, low=0)
  lr: float = cfg.nonnegative_float("step size of local SGD (0: the dataset's, 0.05 on "
                                    "digits, else the paper's 0.01)", 0.0)
  eval_every: int = neural.eval_every(2)
  dataset: str = neural.dataset("digits", "the data: digits (offline), CIFAR-10/100, EMNIST, "
                                "FEMNIST (their files: fedjax-rep data), or any registered "
                                "dataset (fedjax-rep list)")
  num_clients: int = cfg.positive_int("number of clients M (0: the dataset's, 50 on digits, "
                                      "else the paper's 100)", 0, low=0)
  classes_per_client: int = cfg.positive_int(
      "classes per client S (0: the dataset's, the paper's 5 on CIFAR-10 and EMNIST, 20 on "
      "CIFAR-100, 3 on FEMNIST; 5 on digits, else 2)", 0, low=0)
  algorithms: tuple = cfg.choice("algorithms to compare (FedRep always runs: it sets the "
                                 "target)", tuple(TIMED), tuple(TIMED), sequence=True)
  n0_fraction: float = cfg.fraction("SRPFL's (and FLANP's) first participants n0 = max(1, "
                                    "round(n0_fraction x N)) (the authors: 10 of 100)", 0.1)
  stage_rounds: int = cfg.positive_int("rounds per SRPFL stage before the participants "
                                       "double (the authors: 10)", 10)
  target_fraction: float = cfg.fraction("target accuracy = target_fraction x FedRep's final "
                                        "accuracy, per seed and setting", 0.9)

  def check(self):
    """S must fit the dataset's classes and the dataset's files must be there (before any
    work: DataMissing names the command that prepares them)."""
    classes = setting(self)["classes"]
    if setting(self)["classes_per_client"] > classes:
      raise cfg.ConfigError(f"classes_per_client={self.classes_per_client} is out of range: "
                            f"{self.dataset} has {classes} classes")
    neural.check_dataset(self.dataset)


def setting(config: Config) -> dict:
  """The dataset's classes (`data.datasets`), M, S, lr, local epochs and samples per client
  (SETTINGS, else OTHER), with the config's non-zero fields over them."""
  fields = vars(config)
  values = {"samples_per_client": 0, **SETTINGS.get(config.dataset, OTHER)}
  return {"classes": datasets.lookup(config.dataset).num_classes,
          **{k: fields.get(k, 0) or v for k, v in values.items()}}


def data(config: Config, seed_values) -> federated.ClientDatasets:
  """Every seed's M clients (S classes each, near-equal sizes; the seed draws the partition,
  and the split of a seeded dataset), stacked along a leading seed axis
  (`neural.stacked_datasets`); the pool is first cut to M x samples_per_client training
  samples where the setting has them (drawn from config.seed: `datasets.subsample`)."""
  s = setting(config)
  pooled = datasets.by_seed(config.dataset, config.seed)

  def dataset(run):
    x, y, x_test, y_test = pooled(run["seed"])
    if s["samples_per_client"]:
      x, y, x_test, y_test = datasets.subsample(
          (x, y, x_test, y_test), s["num_clients"] * s["samples_per_client"], config.seed)
    parts, test_parts = partition_lib.partition(
        "classes", y, y_test, num_clients=s["num_clients"], seed=run["seed"],
        classes_per_client=s["classes_per_client"])
    return federated.client_datasets(x, y, parts, x_test, y_test, test_parts, s["classes"])

  return neural.stacked_datasets(config, [{"seed": seed} for seed in seed_values], dataset)


def algorithm_names(config: Config) -> tuple:
  """config.algorithms and FedRep (it sets the target), in TIMED's order."""
  return tuple(a for a in TIMED if a == "fedrep" or a in config.algorithms)


def first_reached(result: dict, targets: np.ndarray):
  """(rounds [seeds], times [seeds]) of a result with a seed axis: the first evaluated
  round whose test accuracy is at least targets [seeds], and the wall clock then; NaN
  where never."""
  hits = result["eval"]["test_accuracy"] >= targets[:, None]
  rounds = np.asarray(result["eval_rounds"])[np.argmax(hits, axis=1)]
  times = np.take_along_axis(result["metrics"]["wall_clock"], rounds[:, None] - 1, axis=1)[:, 0]
  reached = hits.any(axis=1)
  return np.where(reached, rounds, np.nan), np.where(reached, times, np.nan)


def run_setting(config: Config, clients, seed_values, batch, *, speed: str,
                participation: float, grid=None) -> list[dict]:
  """Rows of every algorithm with one speed model and participation, for every C and every
  combination of `grid` (traced keys: lr, momentum, weight_decay; None: config's values):
  per timed neural algorithm, its schedules x combinations on every seed by `batch` (units
  '<timed algorithm>-<speed>-r<participation>')."""
  s = setting(config)
  num_clients = neural.training_count(config, s["num_clients"])
  cohort = cohort_size(num_clients, participation)
  n0 = max(1, round(config.n0_fraction * cohort))
  schedules = {True: timed.srpfl_participants(cohort, n0, config.rounds, config.stage_rounds),
               False: timed.fixed_participants(cohort, cohort, config.rounds)}
  model = neural.dataset_model(config.dataset, clients.input_spec(runs=1).shape,
                               config.precision)
  combos = grid or [{}]
  first_cost = config.comm_costs[0]  # trained (and logged live) at C = comm_costs[0]
  inner_hparams = [hparams_lib.hparams(setting(c)["lr"], c.momentum, c.weight_decay)
                   for c in (cfg.apply(config, combo) for combo in combos)]
  keys = neural.run_keys(seed_values)
  names = algorithm_names(config)
  inners = {inner: nn_algorithms.make_algorithm(inner, model=model, cohort=cohort,
                                              local_epochs=s["local_epochs"],
                                              head_epochs=config.head_epochs,
                                              batch_size=config.batch_size,
                                              client_group=config.client_group,
                                              ft_epochs=config.head_epochs,
                                              eval_clients=config.eval_clients)
            for inner in dict.fromkeys(TIMED[name][0] for name in names)}
  results = {}
  for inner in inners:  # one program for all of them where they share it (`nn.program`)
    group = [(c, name) for c in range(len(combos)) for name in names
             if TIMED[name][0] == inner]
    programs = [neural.shared_program(config, inners[inner], each, list(inners.values()),
                                      clients) for each in inner_hparams]
    algorithm = timed.EvaluatedTimed(neural.with_new_clients(programs[0][0], config, clients),
                                     sc.speed_model(speed, num_clients),
                                     cohort=cohort, name=f"timed-{programs[0][0].name}")
    unit_name = f"{inner}-{speed}-r{participation:g}"
    trained = batch.train(
        unit_name, algorithm, clients,
        [timed.hparams(programs[c][1], schedules[TIMED[name][1]], first_cost)
         for c, name in group],
        keys, config.rounds, eval_every=config.eval_every,
        members=[shared.members(name, seed_values, speed_model=speed,
                                participation=participation, comm_cost=first_cost,
                                **combos[c]) for c, name in group])
    results.update(zip(group, trained))

  rows = []
  for c, combo in enumerate(combos):
    final = results[c, "fedrep"]["eval"]["test_accuracy"][:, -summaries.LAST_EVALUATIONS:]
    targets = config.target_fraction * final.mean(axis=1)
    for comm_cost in config.comm_costs:
      for name in names:
        result = results[c, name]
        if comm_cost != first_cost:  # the same runs, another cost per round
          clock = result["metrics"]["wall_clock"] + (comm_cost - first_cost) * np.arange(
              1, config.rounds + 1)
          result = {**result, "metrics": {**result["metrics"], "wall_clock": clock}}
        rounds, times = first_reached(result, targets)
        for i, seed in enumerate(seed_values):
          rows += [{**row, "target": float(targets[i]), "rounds_to_target": float(rounds[i]),
                    "time_to_target": float(times[i])}
                   for row in summaries.rows(name, [seed], neural.runs(result, i, i + 1),
                                             speed_model=speed, participation=participation,
                                             comm_cost=comm_cost, **combo)]
  return rows


def run(config: Config, seeds: int, batch, grid=None) -> list[dict]:
  seed_values = config.seed_values(seeds)
  clients = data(config, seed_values)
  rows = []
  for speed in config.speed_models:
    for participation in config.participation:
      rows += run_setting(config, clients, seed_values, batch, speed=speed,
                          participation=participation, grid=grid)
  return rows


def summarize(rows, config: Config) -> list[dict]:
  """Per speed model, participation, C and algorithm: the final test accuracy (as
  nn_common.summary), the mean target, the mean time and rounds to target over the seeds
  that reach it, how many do, and the time relative to FedRep's."""
  table = []
  for speed in config.speed_models:
    for participation in config.participation:
      for comm_cost in config.comm_costs:
        selected = plotting.select(rows, speed_model=speed, participation=participation,
                                   comm_cost=comm_cost)
        entries = summaries.summary(selected, algorithm_names(config), config.summary)
        for entry in entries:
          runs = plotting.select(selected, algorithm=entry["algorithm"], round=1)
          reached = [r for r in runs if np.isfinite(r["time_to_target"])]
          entry.update(speed_model=speed, participation=participation, comm_cost=comm_cost,
                       target=float(np.mean([r["target"] for r in runs])),
                       reached=f"{len(reached)}/{len(runs)}",
                       **{key: float(np.mean([r[key] for r in reached])) if reached else np.nan
                          for key in ("time_to_target", "rounds_to_target")})
        fedrep = next(e for e in entries if e["algorithm"] == "fedrep")
        for entry in entries:
          entry["time_vs_fedrep"] = entry["time_to_target"] / fedrep["time_to_target"]
        table += entries
  return table


def participation_label(participation: float) -> str:
  return "full participation" if participation == 1 else f"{participation:.0%} participation"


def plot(rows, config: Config, file) -> None:
  """Test accuracy vs wall clock (log scale: SRPFL's first stages take little time): one
  panel per (speed model, participation) row and C column, one line per algorithm (mean
  over seeds, min-max band), the target dotted."""
  settings = [(speed, p) for speed in config.speed_models for p in config.participation]
  fig, axes = plotting.figure(len(config.comm_costs), width=4.4, height=3.3, rows=len(settings))
  axes = np.asarray(axes).reshape(len(settings), len(config.comm_costs))
  for i, (speed, participation) in enumerate(settings):
    for j, comm_cost in enumerate(config.comm_costs):
      ax = axes[i, j]
      panel = plotting.select(rows, speed_model=speed, participation=participation,
                              comm_cost=comm_cost)
      grids = list(dict.fromkeys(r["grid"] for r in panel if "grid" in r)) or [None]
      for name in algorithm_names(config):
        inner, doubling = TIMED[name]
        for g, label in enumerate(grids):  # a --grid: one line per combination, darker
          where = {"algorithm": name} if label is None else {"algorithm": name, "grid": label}
          xs, mean, low, high = plotting.curves(panel, "wall_clock", "test_accuracy",
                                                along="round", **where)
          ax.plot(xs, mean, color=COLORS[inner], ls="-" if doubling else "--", lw=1.4,
                  alpha=1 - 0.6 * g / len(grids),
                  label=labels.label(name) + ("" if label is None else f" ({label})"))
          ax.fill_between(xs, low, high, color=COLORS[inner], alpha=0.12, lw=0)
      ax.axhline(np.mean([r["target"] for r in panel if r["round"] == 1]), color="black",
                 ls=":", lw=1, label="target")
      ax.set_title(f"{speed} speeds, {participation_label(participation)}, C = {comm_cost:g}")
      ax.set(xscale="log", xlabel="simulated wall-clock time", ylabel="test accuracy")
      ax.grid(alpha=0.3)
  s = setting(config)
  model = datasets.lookup(config.dataset).model or "its model by input shape"
  fig.suptitle(f"SRPFL (neural): {config.dataset}, {model}, M={s['num_clients']}, "
               f"S={s['classes_per_client']}; SRPFL/FLANP double from n0 = "
               f"{config.n0_fraction:g} N every {config.stage_rounds} rounds; target = "
               f"{config.target_fraction:g} x FedRep's final accuracy")
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="srpfl-neural",
    rank=160,
    docs="docs/papers/srpfl.md#neural-networks-srpfl-neural",
    summary="SRPFL on neural nets: test accuracy vs simulated wall-clock time, SRPFL, "
            "LG-SRPFL, FLANP(-FT) vs FedRep, LG-FedAvg, FedAvg(-FT); fixed and dynamic "
            "speeds, C in {0, 10, 100}, full and 20% participation",
    config=Config, quick={"rounds": 60, "stage_rounds": 5, "participation": (1.0,),
                         "speed_models": ("fixed",), "algorithms": QUICK_ALGORITHMS},
    run=run, plot=plot, default_seeds=2, summarize=summarize, traced=neural.TRACED))
