"""What the Table-1 recipes share: FedRep's Table 1 (the paper's numbers), the algorithms
compared, the baselines' configuration fields, running every setting, table1.csv and
the figure.

A Table-1 recipe has several settings (e.g. CIFAR-10's (n, S) pairs), each a dict of the
configuration values it sets (metrics.csv columns). Settings with the same number of
clients are stacked along the runs axis with the seeds (padded to one shape) and run as
one vmapped program per algorithm; the others are separate programs.
"""

import dataclasses

import numpy as np

from fedjax_rep.data import federated
from fedjax_rep.data import partition as partition_lib
from fedjax_rep.nn import conventions as conventions_lib
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import neural as common
from fedjax_rep.experiments import placement
from fedjax_rep.experiments import plotting

# The rows of FedRep's Table 1 in its order, then rows the paper does not have (EXTRA:
# FedBABU, a body-only baseline reported beside FedRep by later papers).
PAPER_ALGORITHMS = ("local", "fedavg", "fedavg-ft", "fedprox", "fedprox-ft", "scaffold",
                    "scaffold-ft", "fed-mtl", "per-fedavg", "lg-fedavg", "l2gd", "apfl",
                    "ditto", "fedper", "fedrep")
EXTRA = ("fedbabu",)
ALGORITHMS = PAPER_ALGORITHMS + EXTRA
LABELS = {"local": "Local only", "fedavg": "FedAvg", "fedavg-ft": "FedAvg + FT",
          "fedprox": "FedProx", "fedprox-ft": "FedProx + FT", "scaffold": "SCAFFOLD",
          "scaffold-ft": "SCAFFOLD + FT", "fed-mtl": "Fed-MTL", "per-fedavg": "Per-FedAvg",
          "lg-fedavg": "LG-FedAvg", "l2gd": "L2GD", "apfl": "APFL", "ditto": "Ditto",
          "fedper": "FedPer", "fedrep": "FedRep", "fedbabu": "FedBABU (not in paper)"}

# FedRep Table 1 (Collins et al. 2021), test accuracy in %, one column per
# (dataset, n, S); the algorithms in PAPER_ALGORITHMS order.
_COLUMNS = (("cifar10", 100, 2), ("cifar10", 100, 5), ("cifar10", 1000, 2),
            ("cifar100", 100, 5), ("cifar100", 100, 20), ("sent140", 183, 2),
            ("femnist", 150, 3))
_TABLE = (
    (89.79, 70.68, 78.30, 75.29, 41.29, 69.88, 60.86),  # Local only
    (42.65, 51.78, 44.31, 23.94, 31.97, 52.75, 51.64),  # FedAvg
    (87.65, 73.68, 82.04, 79.34, 55.44, 71.92, 72.41),  # FedAvg + FT
    (39.92, 50.99, 21.93, 20.17, 28.52, 52.33, 18.89),  # FedProx
    (85.81, 72.75, 75.41, 78.52, 55.09, 71.21, 53.54),  # FedProx + FT
    (37.72, 47.33, 33.79, 20.32, 22.52, 51.31, 17.65),  # SCAFFOLD
    (86.35, 68.23, 78.24, 78.88, 44.34, 71.49, 52.11),  # SCAFFOLD + FT
    (80.46, 58.31, 76.53, 71.47, 41.25, 71.20, 54.11),  # Fed-MTL
    (82.27, 67.20, 67.36, 72.05, 52.49, 68.45, 71.51),  # Per-FedAvg
    (84.14, 63.02, 77.48, 72.44, 38.76, 70.37, 62.08),  # LG-FedAvg
    (81.04, 59.98, 71.96, 72.13, 42.84, 70.67, 66.18),  # L2GD
    (83.77, 72.29, 82.39, 78.20, 55.44, 69.87, 70.74),  # APFL
    (85.39, 70.34, 80.36, 78.91, 56.34, 71.04, 68.28),  # Ditto
    (87.13, 73.84, 81.73, 76.00, 55.68, 72.12, 76.91),  # FedPer
    (87.70, 75.68, 83.27, 79.15, 56.10, 72.41, 78.56),  # FedRep
)
PAPER = {column: {name: row[j] / 100 for name, row in zip(PAPER_ALGORITHMS, _TABLE)}
         for j, column in enumerate(_COLUMNS)}


def paper_accuracy(dataset: str, setting: dict, algorithm: str,
                   paper: dict = PAPER) -> float | None:
  """A paper table's accuracy (a fraction; default FedRep Table 1, {(dataset, n, S):
  {algorithm: accuracy}}) of `algorithm` in `setting` of `dataset`, or None where the
  paper has no such entry."""
  for (name, n, s), values in paper.items():
    if name == dataset and n == setting.get("num_clients") and s == setting.get(
        "classes_per_client", s):
      return values.get(algorithm)
  return None


@dataclasses.dataclass(frozen=True)
class Fields(common.Training):
  """The configuration fields every Table-1 recipe has: the neural training schedule, the
  algorithms (the baselines' hyperparameters are their traced options, --set keys), and
  the authors' code's training conventions (`nn.conventions`: the papers' tables came from
  that code). A recipe's Config derives from it and adds its data fields."""
  algorithms: tuple = cfg.choice("algorithms to compare", ALGORITHMS, ALGORITHMS,
                                 sequence=True)
  conventions: str = common.conventions(conventions_lib.AUTHORS)


def leaf_averaging():
  """The `averaging` knob of the recipes on LEAF data: FedRep's code weights LEAF clients by
  their sample counts (uniform only on CIFAR), so its conventions there are "samples"."""
  return common.convention("averaging", "samples")


def source():
  return cfg.choice("where the data come from: the prepared files, or random mock data in "
                    "the same format (tests and --quick: the accuracies mean nothing)",
                    "files", ("files", "mock"))


def mock_data(config, dataset: str) -> str | None:
  """What a configuration with a `source` field trains on instead of `dataset` (e.g.
  'CIFAR-10'): "random examples in the format of CIFAR-10" for source=mock, else None."""
  return f"random examples in the format of {dataset}" if config.source == "mock" else None


def check_paired(config, *names: str) -> None:
  """ConfigError unless the sequence fields `names` have the same length."""
  lengths = {n: len(getattr(config, n)) for n in names}
  if len(set(lengths.values())) > 1:
    raise cfg.ConfigError(f"{' and '.join(names)} pair up into settings, so they need the "
                          f"same length; got {lengths}")


def run(config, seeds: int, unit, progress, settings: list[dict], dataset, model,
        grid=None) -> list:
  """metrics.csv rows of every algorithm of config.algorithms in every setting, and in
  every combination of `grid` (traced keys: `neural.trained`).

  dataset(setting, seed) -> ClientDatasets or FlatClients (with config's validation split,
  `neural.validated`, then laid out for config's devices: `placement.laid_out`); model:
  the Classifier. Settings with equal num_clients run, with every seed and combination, as
  one program per algorithm (cached unit '<algorithm>-n<num_clients>')."""
  seed_values = list(range(config.seed, config.seed + seeds))
  groups = {}
  for setting in settings:
    groups.setdefault(setting["num_clients"], []).append(setting)
  rows = []
  for num_clients, group in groups.items():
    data = federated.stack([placement.laid_out(common.validated(dataset(s, seed), config, seed),
                                               config) for s in group for seed in seed_values])
    group_keys = common.run_keys(seed_values, len(group))  # run i*seeds + j: setting i
    for name in config.algorithms:
      results = common.trained(unit, f"{name}-n{num_clients}", name, config, model, data,
                               group_keys, num_clients, progress, grid)
      for combination, result in zip(grid or [{}], results):
        for i, setting in enumerate(group):
          part = common.runs(result, i * seeds, (i + 1) * seeds)
          rows += common.rows(name, seed_values, part, **setting, **combination)
  return rows


@dataclasses.dataclass(frozen=True)
class ShardConfig(Fields):
  """Configuration of the S-classes-per-client recipes (CIFAR-10/100, FEMNIST)."""
  num_clients: tuple = cfg.positive_int("number of clients n of each setting", (100,),
                                        sequence=True)
  classes_per_client: tuple = cfg.positive_int(
      "classes per client S of each setting (paired with num_clients)", (2,), sequence=True)
  size_sigma: float = cfg.nonnegative_float(
      "log-normal spread of client sizes (0: equal sizes, 50,000/n each on CIFAR)", 0.0)
  source: str = source()
  mock_examples: int = cfg.positive_int("examples per split of the mock data", 600)

  def check(self):
    check_paired(self, "num_clients", "classes_per_client")


def shard_settings(config: ShardConfig) -> list[dict]:
  return [{"num_clients": n, "classes_per_client": s}
          for n, s in zip(config.num_clients, config.classes_per_client)]


def shard_run(config: ShardConfig, seeds, unit, progress, arrays, model,
              grid=None) -> list[dict]:
  """Rows of every algorithm on the pooled arrays (x, y, x_test, y_test) partitioned by
  `partition.classes` in every setting."""
  x, y, x_test, y_test = arrays
  num_classes = int(y.max()) + 1

  def dataset(setting, seed):
    parts, test_parts = partition_lib.partition(
        "classes", y, y_test, num_clients=setting["num_clients"], seed=seed,
        classes_per_client=setting["classes_per_client"], size_sigma=config.size_sigma)
    return federated.client_datasets(x, y, parts, x_test, y_test, test_parts, num_classes)

  return run(config, seeds, unit, progress, shard_settings(config), dataset, model, grid)


def table(rows, config, dataset: str, settings: list[dict], paper: dict = PAPER) -> list[dict]:
  """table1.csv: per setting and algorithm, the measured test accuracy (the mean over
  seeds of each seed's config.summary statistic, by default its mean over its last 10
  evaluations, or all where fewer, and its std over seeds; `neural.summary`, whose
  `statistic` column names it) beside the paper's (`paper`, default FedRep Table 1; empty
  where the paper has none)."""
  out = []
  for setting in settings:
    selected = plotting.select(rows, **setting)
    for entry in common.summary(selected, config.algorithms, config.summary):
      value = paper_accuracy(dataset, setting, entry["algorithm"], paper)
      out.append({**setting, **entry, "paper_test_accuracy": "" if value is None else value})
  return out


def setting_label(setting: dict) -> str:
  """A short title of a setting, e.g. 'n=100, S=2'."""
  short = {"num_clients": "n", "classes_per_client": "S"}
  return ", ".join(v if k == "grid" else f"{short.get(k, k)}={v}" for k, v in setting.items())


def plot(rows, config, file, dataset: str, settings: list[dict], title: str,
         paper: dict = PAPER, labels: dict = LABELS, paper_name: str = "FedRep Table 1") -> None:
  """One panel per setting (and per combination of a --grid: rows with a `grid` column): a
  horizontal bar per algorithm (measured accuracy, its std over seeds as an error bar) with
  the paper's value as a red diamond where it has one; `title`, and below it the
  conventions (`neural.conventions_text`) and the statistic the bars show
  (`neural.averaged_text` of config.summary), above the panels."""
  grids = list(dict.fromkeys(r["grid"] for r in rows if "grid" in r))
  if grids:
    settings = [{**setting, "grid": label} for setting in settings for label in grids]
  summary = table(rows, config, dataset, settings, paper)
  names = list(config.algorithms)
  columns = min(len(settings), 3)
  fig, axes = plotting.grid_of(len(settings), columns, width=max(4.0, 7.5 / columns),
                               height=0.3 * len(names) + 1.4)  # two title lines at any width
  for ax, setting in zip(axes, settings):
    entries = {e["algorithm"]: e for e in summary if all(e[k] == v for k, v in setting.items())}
    ys = np.arange(len(names))[::-1]
    measured = [entries[n]["test_accuracy"] for n in names]
    spread = [entries[n]["test_accuracy_std_over_seeds"] for n in names]
    ax.barh(ys, measured, xerr=spread, color="tab:blue", alpha=0.75, ecolor="0.3",
            label="measured (std over seeds)")
    paper = [(y, entries[n]["paper_test_accuracy"]) for y, n in zip(ys, names)
             if entries[n]["paper_test_accuracy"] != ""]
    if paper:
      ax.plot([p for _, p in paper], [y for y, _ in paper], "D", color="tab:red", ms=5,
              label=paper_name)
    ax.set_yticks(ys, [labels[n] for n in names])
    ax.set(xlim=(0, 1), xlabel="test accuracy", title=setting_label(setting))
    ax.grid(axis="x", alpha=0.3)
  swept = any(f"{key}=" in label for label in grids
              for key in ("conventions", *conventions_lib.KNOBS))
  conventions = ("conventions as each panel says" if swept else
                 common.conventions_text(config)) + common.options_text(config)
  fig.suptitle(f"{title}\n{conventions}; {common.averaged_text(rows, config.summary)}")
  plotting.save(fig, file)
