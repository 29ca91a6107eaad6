"""fedrep-fig5: FedRep's Fig. 5 (Section 5.2): local test error vs the local epochs E per
round, FedRep (E head epochs, then `local_epochs` = 1 body epoch) against FedAvg (E epochs
of the whole model); the paper: CIFAR-10, n = 100, S = 2, FedRep's error non-increasing in
E, FedAvg's not.

Data: scikit-learn's digits by default (offline; `dataset=cifar10`: the tfds files), split
over n = 100 clients by S = 2 class shards as `digits-personalized` builds them; FedRep's
CIFAR schedule (r = 0.1, 100 rounds, momentum 0.5, weight decay 1e-4, batch 10), the digits
MLP at lr 0.05. Every (algorithm, E) is a member of one traced program (`nn.program`: one
compilation, each member's epochs traced, the epochs past them skipped). A run's error is
1 - its statistic (the papers': mean of the last 10 evaluations, every round) of the mean
client accuracy, each client tested with its own parameters (FedAvg: the global model);
summary.csv gives its mean and std over seeds per algorithm and E. Choices and departures:
docs/papers/fedrep.md.
"""

import dataclasses

from fedjax_rep.data import datasets
from fedjax_rep.nn import cost as cost_lib
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.experiments import plotting
from fedjax_rep.experiments.recipe_registry import Recipe, register
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import partitioned
from fedjax_rep.recipes.kit import shared
from fedjax_rep.recipes.kit import summaries

E_COLUMN = "local_epochs_E"  # the metrics.csv and summary.csv column of E (a config field)


@dataclasses.dataclass(frozen=True)
class Config(partitioned.Partitioned):
  """digits-personalized's data fields (dataset, partition, S, model, lr 0.05) with Fig. 5's
  values: n = 100, FedRep against FedAvg, every E of `local_epochs_E`."""
  local_epochs_E: tuple = cfg.positive_int(
      "the local epochs E per round compared: the head epochs of an algorithm with FedRep's "
      "head phase (its body epochs stay `local_epochs`), the local epochs of any other",
      (1, 2, 5, 10, 15, 20), sequence=True)
  num_clients: int = cfg.num_clients(100)
  algorithms: tuple = neural.algorithms(("fedrep", "fedavg"))
  local_epochs: int = cfg.positive_int("FedRep's body epochs per round, after its E head "
                                       "epochs (the other algorithms train E epochs)", 1)
  head_epochs: int = cfg.positive_int("FedAvg-FT's fine-tuning epochs before each test "
                                      "(FedRep's head epochs are the E values)", 10)
  eval_every: int = neural.eval_every(1)

  def check(self):
    """partitioned.Partitioned's checks (the dataset's files, the partition); distinct E values,
    and each algorithm's training changed by E (not, e.g., FedRep*'s fixed head epochs)."""
    if len(set(self.local_epochs_E)) != len(self.local_epochs_E):
      raise cfg.ConfigError(f"local_epochs_E={','.join(map(str, self.local_epochs_E))} "
                            f"repeats a value; give each E once")
    for name in self.algorithms:
      built = {algorithm(self, name, e, None, self.num_clients)
               for e in self.local_epochs_E}
      if len(built) != len(self.local_epochs_E):
        raise cfg.ConfigError(f"algorithm {name} trains the same whatever E (its epochs are "
                              f"fixed): choose algorithms whose head or local epochs E sets")
    super().check()


def epochs_field(config: Config, name: str) -> str:
  """The configuration field that E sets for algorithm `name`: head_epochs where it trains a
  head phase first (FedRep), else local_epochs."""
  probe = neural.algorithm(name, config, None, config.num_clients)
  return "head_epochs" if getattr(probe, "head_phase", False) else "local_epochs"


def algorithm(config: Config, name: str, epochs: int, model, num_clients: int):
  """Algorithm `name` of config (`neural.algorithm`) with E = `epochs` (`epochs_field`)."""
  each = dataclasses.replace(config, **{epochs_field(config, name): epochs})
  return neural.algorithm(name, each, model, num_clients)


def members(config: Config) -> list[tuple[str, int]]:
  """(algorithm, E) of every run setting, algorithm-major, E ascending."""
  return [(name, e) for name in config.algorithms for e in sorted(config.local_epochs_E)]


def run(config: Config, seeds: int, batch, grid=None) -> list[dict]:
  """Rows of every (algorithm, E) and combination of `grid` (traced keys) on every seed:
  each (algorithm, E) a member of the program it shares with the others (`nn.program`; one
  `batch.train` per program, units named after its members), each with its cost (COST:
  `nn.cost` of the algorithm at that E) as `neural.trained` gives it."""
  seed_values = config.seed_values(seeds)
  clients = partitioned.data(config, seed_values)
  model = neural.dataset_model(config.dataset, clients.input_spec(runs=1).shape,
                               config.precision, config.model)
  training = neural.training_clients(clients)
  num_clients = neural.training_count(config, config.num_clients)
  own = {m: algorithm(config, *m, model, num_clients) for m in members(config)}
  combos = grid or [{}]
  settings = [cfg.apply(config, combo) for combo in combos]
  groups = {}  # program -> [((member, combination index), hparams)]
  for m in members(config):
    for c, each in enumerate(settings):
      program, hparams = neural.shared_program(each, own[m], neural.hparams(each),
                                               list(own.values()), clients)
      groups.setdefault(program, []).append(((m, c), hparams))
  results = {}
  for program, group in groups.items():
    names = dict.fromkeys(name for ((name, _), _), _ in group)
    epochs = dict.fromkeys(e for ((_, e), _), _ in group)
    unit = f"{'+'.join(names)}-E{'-'.join(map(str, epochs))}"
    trained = batch.train(
        unit, neural.with_new_clients(program, config, clients), clients,
        [hparams for _, hparams in group], neural.run_keys(seed_values), config.rounds,
        eval_every=config.eval_every,
        members=[shared.members(name, seed_values, **{E_COLUMN: e}, **combos[c])
                 for ((name, e), c), _ in group])
    results.update(zip((key for key, _ in group), trained))
  rows = []
  for m in members(config):
    name, e = m
    flops = batch.unit(f"{name}-E{e}-flops", lambda m=m: {"flops_per_round": float(
        cost_lib.round_flops(own[m], training, neural.hparams(config)))})["flops_per_round"]
    for c, each in enumerate(settings):
      cost = {**cost_lib.communication(own[m], training, neural.hparams(each)),
              "flops_per_round": float(flops)}
      rows += summaries.rows(name, seed_values, {**results[m, c], "cost": cost},
                             **{E_COLUMN: e}, **combos[c])
  return rows


def errors(rows, config: Config) -> list[dict]:
  """One point per run (algorithm, E, seed, and `grid` label where the rows have one): its
  local test error, 1 - config.summary's statistic of its test accuracies (NaN where it
  diverged), and its diverged_round."""
  runs = dict.fromkeys((r["algorithm"], r[E_COLUMN], r["seed"], r.get("grid")) for r in rows)
  points = []
  for name, e, seed, grid in runs:
    where = {"algorithm": name, E_COLUMN: e, "seed": seed,
             **({} if grid is None else {"grid": grid})}
    selected = plotting.select(rows, **where)
    (entry,) = summaries.summary(selected, [name], config.summary)
    points.append({**where, "test_error": 1.0 - entry["test_accuracy"],
                   "diverged_round": selected[0].get("diverged_round", 0)})
  return points


def summarize(rows, config: Config) -> list[dict]:
  """summary.csv: per algorithm and E (ascending), the local test error (1 - the test
  accuracy of `summaries.summary`: each seed's statistic, then the mean over the seeds that
  did not diverge) and its std over seeds, its change from the previous E (empty for the
  first: the paper's claim is that FedRep's never rises), and the summary's columns."""
  table = []
  for name in config.algorithms:
    previous = None
    for e in sorted(config.local_epochs_E):
      (entry,) = summaries.summary(plotting.select(rows, **{E_COLUMN: e}), [name],
                                   config.summary)
      error = 1.0 - entry["test_accuracy"]
      table.append({"algorithm": name, E_COLUMN: e, "test_error": error,
                    "test_error_std_over_seeds": entry["test_accuracy_std_over_seeds"],
                    "change_from_previous_E": "" if previous is None else error - previous,
                    **{k: v for k, v in entry.items() if k != "algorithm"}})
      previous = error
  return table


def plot(rows, config: Config, file) -> None:
  """The paper's figure: local test error vs E, one line per algorithm (mean over seeds,
  min-max band)."""
  points = errors(rows, config)
  fig, (ax,) = plotting.figure(1, width=6.4, height=4.4)
  for name in config.algorithms:
    what = "head epochs" if epochs_field(config, name) == "head_epochs" else "local epochs"
    plotting.line(ax, points, E_COLUMN, "test_error", f"{labels.label(name)} (E {what})",
                  algorithm=name)
  ax.set(xlabel="local epochs E per round", xticks=sorted(config.local_epochs_E),
         ylabel="local test error (1 - mean client accuracy)")
  ax.grid(alpha=0.3)
  split = (f"S={config.classes_per_client} classes/client" if config.partition == "classes"
           else f"Dir({config.dirichlet_alpha})" if config.partition == "dirichlet" else "iid")
  model = config.model or datasets.lookup(config.dataset).model or "its model"
  seeds = len({r["seed"] for r in rows})
  swept = {part.split("=")[0] for r in rows if "grid" in r for part in r["grid"].split(", ")}
  lr = "" if "lr" in swept else f", lr={config.lr:g}"  # a grid's lines say theirs
  fig.suptitle(f"FedRep Fig. 5 on {config.dataset} ({model}): n={config.num_clients}, {split}, "
               f"r={config.participation}, {config.rounds} rounds, FedRep body epochs "
               f"{config.local_epochs}{lr}{neural.options_text(config)}\n"
               f"error: {summaries.averaged_text(rows, config.summary)}; band: min-max over "
               f"{seeds} seed{'s' * (seeds != 1)}")
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="fedrep-fig5",
    rank=35,
    docs="docs/papers/fedrep.md#fig-5-local-epochs-fedrep-fig5",
    summary="FedRep Fig. 5: local test error vs local epochs E, FedRep (E head epochs) vs "
            "FedAvg (E epochs), n = 100, S = 2 (digits offline; dataset=cifar10: tfds files)",
    config=Config,
    quick={"num_clients": 20, "rounds": 10, "local_epochs_E": (1, 5)},
    run=run, plot=plot, default_seeds=3, summarize=summarize, traced=neural.traced_keys,
    summary_only=summaries.COST))
