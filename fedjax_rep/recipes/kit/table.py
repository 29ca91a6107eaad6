"""What the Table-1 recipes share (FedRep's, FLUTE's, the synthetic one): their
configuration fields, running every setting, table1.csv beside a paper's numbers (each
recipe gives its paper's, e.g. `recipes.fedrep.paper`) and the figure.

A Table-1 recipe has several settings (e.g. CIFAR-10's (n, S) pairs), each a dict of the
configuration values it sets (metrics.csv columns). Settings with the same number of
clients are stacked along the runs axis with the seeds (padded to one shape) and run as
one vmapped program per algorithm; the others are separate programs.
"""

import dataclasses

import numpy as np

from fedjax_rep.data import datasets
from fedjax_rep.data import federated
from fedjax_rep.data import partition as partition_lib
from fedjax_rep.nn import conventions as conventions_lib
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import summaries
from fedjax_rep.experiments import plotting


def paper_accuracy(dataset: str, setting: dict, algorithm: str, paper: dict) -> float | None:
  """A paper table's accuracy (a fraction) of `algorithm` in `setting` of `dataset`, or
  None where the paper has no such entry.

  Args:
    dataset: the dataset's name, as the paper's columns name it (e.g. "cifar10").
    setting: the setting's values (num_clients, and classes_per_client where it has one).
    algorithm: the algorithm's registered name.
    paper: the paper's table, {(dataset, n, S): {algorithm: accuracy}}.

  Returns:
    The accuracy, or None.
  """
  for (name, n, s), values in paper.items():
    if name == dataset and n == setting.get("num_clients") and s == setting.get(
        "classes_per_client", s):
      return values.get(algorithm)
  return None


@dataclasses.dataclass(frozen=True)
class Fields(neural.Training):
  """The configuration fields every Table-1 recipe has: the neural training schedule, the
  algorithms (any registered neural algorithm; a recipe's Config gives its table's as the
  default; the baselines' hyperparameters are their traced options, --set keys), and the
  authors' code's training conventions (`nn.conventions`: the papers' tables came from
  that code). A recipe's Config derives from it and adds its data fields."""
  algorithms: tuple = neural.algorithms()
  conventions: str = neural.conventions(conventions_lib.AUTHORS)


def leaf_averaging():
  """The `averaging` knob of the recipes on LEAF data: FedRep's code weights LEAF clients by
  their sample counts (uniform only on CIFAR), so its conventions there are "samples"."""
  return neural.convention("averaging", "samples")


def source():
  """The `source` field of the recipes on real data: the prepared files, or mock data."""
  return cfg.choice("where the data come from: the prepared files, or random mock data in "
                    "the same format (tests and --quick: the accuracies mean nothing)",
                    "files", ("files", "mock"))


def mock_data(config, dataset: str) -> str | None:
  """What a configuration with a `source` field trains on instead of `dataset` (e.g.
  'CIFAR-10'): "random examples in the format of CIFAR-10" for source=mock, else None."""
  return f"random examples in the format of {dataset}" if config.source == "mock" else None


def dataset_mock_data(config, title: str) -> str | None:
  """`mock_data` of a configuration whose `dataset` field names a registered dataset (called
  `title`): None where the dataset has no mock (its real arrays, whatever the source)."""
  return mock_data(config, title) if datasets.lookup(config.dataset).mock else None


def check_dataset(config) -> None:
  """The check of a configuration with `dataset` and `source` fields: its dataset's files
  there, where it reads them (`neural.check_dataset`), and its settings paired."""
  check_paired(config, "num_clients", "classes_per_client")
  neural.check_dataset(config.dataset, files=config.source == "files")


def check_paired(config, *names: str) -> None:
  """ConfigError unless the sequence fields `names` have the same length."""
  lengths = {n: len(vars(config)[n]) for n in names}
  if len(set(lengths.values())) > 1:
    raise cfg.ConfigError(f"{' and '.join(names)} pair up into settings, so they need the "
                          f"same length; got {lengths}")


def run(config, seeds: int, batch, settings: list[dict], dataset, model,
        grid=None) -> list:
  """metrics.csv rows of every algorithm of config.algorithms in every setting, and in
  every combination of `grid` (traced keys: `neural.trained`).

  dataset(run) -> one run's ClientDatasets or FlatClients, run: a setting's values and its
  'seed' (`neural.stacked_datasets` adds config's validation split and lays them out for
  config's devices); model: the Classifier. Settings with equal num_clients run, with every
  seed and combination, as one program per algorithm (cached unit
  '<algorithm>-n<num_clients>')."""
  seed_values = config.seed_values(seeds)
  groups = {}
  for setting in settings:
    groups.setdefault(setting["num_clients"], []).append(setting)
  rows = []
  for num_clients, group in groups.items():
    runs = [{**s, "seed": seed} for s in group for seed in seed_values]
    data = neural.stacked_datasets(config, runs, dataset)
    group_keys = neural.run_keys(seed_values, len(group))  # run i*seeds + j: setting i
    for name in config.algorithms:
      results = neural.trained(batch, f"{name}-n{num_clients}", name, config, model, data,
                               group_keys, num_clients, grid, runs=runs)
      for combination, result in zip(grid or [{}], results):
        for i, setting in enumerate(group):
          part = neural.runs(result, i * seeds, (i + 1) * seeds)
          rows += summaries.rows(name, seed_values, part, **setting, **combination)
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
  """The settings of `config`: its (num_clients, classes_per_client) pairs."""
  return [{"num_clients": n, "classes_per_client": s}
          for n, s in zip(config.num_clients, config.classes_per_client)]


def shard_run(config: ShardConfig, seeds, batch, arrays, model,
              grid=None) -> list[dict]:
  """Rows of every algorithm on the pooled arrays (x, y, x_test, y_test) partitioned by
  `partition.classes` in every setting, with the model's classes (model.num_classes)."""
  x, y, x_test, y_test = arrays

  def dataset(run):
    parts, test_parts = partition_lib.partition(
        "classes", y, y_test, num_clients=run["num_clients"], seed=run["seed"],
        classes_per_client=run["classes_per_client"], size_sigma=config.size_sigma)
    return federated.client_datasets(x, y, parts, x_test, y_test, test_parts,
                                     model.num_classes)

  return run(config, seeds, batch, shard_settings(config), dataset, model, grid)


def dataset_run(config: ShardConfig, seeds, batch, grid=None) -> list[dict]:
  """`shard_run` on registered dataset config.dataset (`data.datasets`): its arrays of
  config.seed (with source=mock its mock of config.mock_examples, where it has one), with
  its model (`neural.dataset_model`)."""
  arrays = datasets.arrays(config.dataset, config.seed,
                           config.mock_examples if config.source == "mock" else None)
  model = neural.dataset_model(config.dataset, arrays[0].shape[1:], config.precision)
  return shard_run(config, seeds, batch, arrays, model, grid)


def table(rows, config, dataset: str, settings: list[dict], paper: dict) -> list[dict]:
  """table1.csv: per setting and algorithm, the measured test accuracy (the mean over
  seeds of each seed's config.summary statistic, by default its mean over its last 10
  evaluations, or all where fewer, and its std over seeds; `summaries.summary`, whose
  `statistic` column names it) beside the paper's (`paper`, as `paper_accuracy` takes it;
  empty where the paper has none, e.g. for a plugin's algorithm)."""
  out = []
  for setting in settings:
    selected = plotting.select(rows, **setting)
    for entry in summaries.summary(selected, config.algorithms, config.summary):
      value = paper_accuracy(dataset, setting, entry["algorithm"], paper)
      out.append({**setting, **entry, "paper_test_accuracy": "" if value is None else value})
  return out


def setting_label(setting: dict) -> str:
  """A short title of a setting, e.g. 'n=100, S=2'."""
  short = {"num_clients": "n", "classes_per_client": "S"}
  return ", ".join(v if k == "grid" else f"{short.get(k, k)}={v}" for k, v in setting.items())


def label(name: str, paper: dict) -> str:
  """An algorithm's name in a Table-1 figure: its label (`labels.label`), with "(not in
  paper)" where `paper` (as `paper_accuracy` takes it) has no row of it."""
  known = any(name in column for column in paper.values())
  return labels.label(name) + ("" if known else " (not in paper)")


def plot(rows, config, file, dataset: str, settings: list[dict], title: str, paper: dict,
         paper_name: str) -> None:
  """One panel per setting (and per combination of a --grid: rows with a `grid` column; where
  the rows hold one combination per algorithm and setting, as those chosen by --select do,
  one panel per setting, each algorithm's bar at its combination, named beside it): a
  horizontal bar per algorithm (measured accuracy, its std over seeds as an error bar) with
  the value of `paper` (named `paper_name`) as a red diamond where it has one; `title`, and
  below it the conventions (`neural.conventions_text`) and the statistic the bars show
  (`summaries.averaged_text` of config.summary), above the panels."""
  names = list(config.algorithms)
  grids = list(dict.fromkeys(r["grid"] for r in rows if "grid" in r))
  held = {(r["algorithm"], *(r.get(k) for k in settings[0]), r["grid"]) for r in rows
          if "grid" in r}
  each = [[{**setting, "grid": g} for g in grids] if grids else [setting]
          for setting in settings]
  chosen = bool(grids) and all(
      sum((n, *s.values(), g) in held for g in grids) <= 1 for s in settings for n in names)
  panels = each if chosen else [[one] for group in each for one in group]
  summary = table(rows, config, dataset, [one for group in each for one in group], paper)
  columns = min(len(panels), 3)
  fig, axes = plotting.grid_of(len(panels), columns, width=max(4.0, 7.5 / columns),
                               height=0.3 * len(names) + 1.4)  # two title lines at any width
  for ax, group in zip(axes, panels):
    entries = {e["algorithm"]: e for setting in group for e in summary
               if all(e[k] == v for k, v in setting.items())
               and (not chosen or (e["algorithm"], *setting.values()) in held)}
    ys = np.arange(len(names))[::-1]
    nan = {"test_accuracy": np.nan, "test_accuracy_std_over_seeds": np.nan,
           "paper_test_accuracy": ""}
    entries = {n: entries.get(n, nan) for n in names}
    measured = [entries[n]["test_accuracy"] for n in names]
    spread = [entries[n]["test_accuracy_std_over_seeds"] for n in names]
    ax.barh(ys, measured, xerr=spread, color="tab:blue", alpha=0.75, ecolor="0.3",
            label="measured (std over seeds)")
    reported = [(y, entries[n]["paper_test_accuracy"]) for y, n in zip(ys, names)
                if entries[n]["paper_test_accuracy"] != ""]
    if reported:
      ax.plot([p for _, p in reported], [y for y, _ in reported], "D", color="tab:red", ms=5,
              label=paper_name)
    ax.set_yticks(ys, [label(n, paper) + (f" ({entries[n]['grid']})" if chosen and "grid" in
                                          entries[n] else "") for n in names])
    heading = setting_label({k: v for k, v in group[0].items() if not chosen or k != "grid"})
    ax.set(xlim=(0, 1), xlabel="test accuracy",
           title=heading + (", each at its chosen combination" if chosen else ""))
    ax.grid(axis="x", alpha=0.3)
  swept = any(f"{key}=" in label for label in grids
              for key in ("conventions", *conventions_lib.KNOBS))
  conventions = ("conventions as each panel says" if swept else
                 neural.conventions_text(config)) + neural.options_text(config)
  fig.suptitle(f"{title}\n{conventions}; {summaries.averaged_text(rows, config.summary)}")
  plotting.save(fig, file)
