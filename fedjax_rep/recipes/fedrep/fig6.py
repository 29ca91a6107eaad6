"""fedrep-fig6: FedRep's Fig. 6 (Section 5.2): new clients of classes no training client
has fine-tune on each method's final model, and are tested after each epoch count.

Training: the Fig.-6 algorithms in fedrep-table1-femnist's setting (S classes per client,
log-normal sizes, r = 0.1, FedRep's schedule, the authors' conventions), by the batch
runner. New clients: per seed, `finetune_clients` each with its own draw of
`finetune_samples` training and `finetune_test` test samples of the new classes; each adapts
by the algorithm's `new_clients` (a head from zero on the frozen server body; LG-FedAvg and
L2GD: their own rules, docs/neural.md) for each count of `finetune_epochs`, computed with
the training unit (its `keep`: no state is stored). Data: scikit-learn's digits split by
class (the default, offline: classes 0-4 train, 5-9 are new; the digits-mlp), or LEAF's
FEMNIST (letters A-J train, digits 0-9 are new; FedRep's MLP). Choices:
docs/papers/fedrep.md.
"""

import dataclasses
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import loop
from fedjax_rep.core import tree
from fedjax_rep.data import datasets, digits, federated, leaf
from fedjax_rep.data import partition as partition_lib
from fedjax_rep.nn import models
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.experiments import plotting
from fedjax_rep.experiments.recipe_registry import Recipe, register
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import shared
from fedjax_rep.recipes.kit import summaries
from fedjax_rep.recipes.kit import table

# Fig. 6's algorithms, in the paper's order (FedRep first).
DEFAULT_ALGORITHMS = ("fedrep", "fedavg", "per-fedavg", "lg-fedavg", "apfl", "l2gd", "fedprox")
# (num_clients, classes_per_client) where they are auto: Table 1's FEMNIST setting, and its
# digits stand-in (5 classes over fewer clients: ~670 training samples in all).
AUTO = {"femnist": (150, 3), "digits": (30, 2)}
NUM_CLASSES = 10  # the model's outputs: digits' classes; FEMNIST's letters A-J, and its digits
TITLES = {"femnist": "FEMNIST letters A-J -> digits", "digits": "sklearn digits"}
# The algorithms (of the table in docs/neural.md "New clients") whose new clients adapt other
# than by a head on the frozen server body: the words the figure's legend adds to their name.
OWN_RULES = {"lg-fedavg": "lower layers tuned", "local": "whole model tuned",
             "l2gd": "whole model tuned", "fed-mtl": "whole model tuned",
             "fedbabu": "body and head tuned"}


@dataclasses.dataclass(frozen=True)
class Config(table.Fields):
  UNSHARDED = "fedrep-fig6 (its new clients are fine-tuned on one device)"
  algorithms: tuple = neural.algorithms(DEFAULT_ALGORITHMS)
  dataset: str = cfg.choice(
      "the data: scikit-learn's digits split by class (offline: the first classes train, "
      "the new clients hold the last unseen_classes) or LEAF's FEMNIST (the letters A-J "
      "train, the new clients hold the digits)", "digits", tuple(AUTO))
  source: str = table.source()
  unseen_classes: int = cfg.positive_int(
      "dataset=digits: classes held out of training (the last ones), the new clients' "
      "classes", 5)
  num_clients: int | None = cfg.setting(
      None, cfg.Check(int, low=1, optional=True, auto="150 on femnist, 30 on digits"),
      "training clients n")
  classes_per_client: int | None = cfg.setting(
      None, cfg.Check(int, low=1, optional=True, auto="3 on femnist, 2 on digits"),
      "training classes per client S")
  size_sigma: float = cfg.nonnegative_float("log-normal spread of the training clients' "
                                            "sizes (0: equal)", 0.5)
  samples_per_client: int = cfg.positive_int(
      "dataset=femnist: mean training samples per client (the pooled letters are subsampled "
      "to n times it, as in fedrep-table1-femnist)", 148)
  rounds: int = cfg.rounds(200)
  averaging: str | None = table.leaf_averaging()
  finetune_epochs: tuple = cfg.positive_int(
      "epochs of the new clients' fine-tuning at which they are tested (the x-axis)",
      (1, 2, 5, 10, 20, 50, 100, 200), sequence=True)
  finetune_clients: int = cfg.positive_int("new clients per seed", 10)
  finetune_samples: int = cfg.positive_int(
      "training samples of each new client (its own draw from the new classes' pool)", 500)
  finetune_test: int = cfg.positive_int(
      "test samples of each new client (its own draw from the new classes' test pool; all "
      "of them where fewer)", 500)
  mock_examples: int = cfg.positive_int("dataset=femnist, source=mock: training images per "
                                        "user of the mock data", 600)

  def check(self):
    """The partition and the new clients' samples must be possible (digits: checked on the
    labels, no training); FEMNIST's files must be there (source=files)."""
    super().check()
    n, s = setting(self)
    if self.dataset == "femnist":
      if self.source == "files":
        leaf.require("femnist", None)
      return
    seen = digits.NUM_CLASSES - self.unseen_classes
    if seen < 1:
      raise cfg.ConfigError(f"unseen_classes={self.unseen_classes} leaves no class to train "
                            f"on; digits has {digits.NUM_CLASSES} classes")
    _, y, _, y_test = digits.load(self.seed)
    pool = int(np.sum(y >= seen))
    if self.finetune_samples > pool:
      raise cfg.ConfigError(f"finetune_samples={self.finetune_samples} is more than the "
                            f"{pool} training samples of the {self.unseen_classes} unseen "
                            f"digits classes")
    try:
      partition_lib.classes(y[y < seen], y_test[y_test < seen], n, s, self.seed,
                            self.size_sigma)
    except ValueError as error:
      raise cfg.ConfigError(f"{error} (digits has {np.sum(y < seen)} training samples of the "
                            f"{seen} training classes)") from None


def setting(config: Config) -> tuple[int, int]:
  """(num_clients, classes_per_client) of `config`, its auto values resolved (`AUTO`)."""
  n, s = AUTO[config.dataset]
  return (n if config.num_clients is None else config.num_clients,
          s if config.classes_per_client is None else config.classes_per_client)


def femnist_arrays(config: Config) -> tuple[tuple, tuple]:
  """(letters, digits) of FEMNIST: each (x, y, x_test, y_test) pooled over LEAF's writers
  (`leaf.femnist_pooled`), the letters A-J relabelled 0-9 and subsampled to num_clients x
  samples_per_client training samples (drawn by config.seed, as fedrep-table1-femnist), the
  digits 0-9 all. source=mock: random LEAF-format files instead."""
  n, _ = setting(config)
  with tempfile.TemporaryDirectory() as tmp:
    directory = None if config.source == "files" else leaf.write_example(
        "femnist", tmp, 3 * n, config.mock_examples, seed=config.seed)
    x, y, x_test, y_test = leaf.femnist_pooled(None, directory)
  first, last = min(leaf.FEMNIST_LETTERS), max(leaf.FEMNIST_LETTERS)
  letter, letter_test = (y >= first) & (y <= last), (y_test >= first) & (y_test <= last)
  letters = datasets.subsample((x[letter], y[letter] - first, x_test[letter_test],
                                y_test[letter_test] - first), n * config.samples_per_client,
                               config.seed)
  digit, digit_test = y < NUM_CLASSES, y_test < NUM_CLASSES  # LEAF's labels 0-9: digits
  return letters, (x[digit], y[digit], x_test[digit_test], y_test[digit_test])


def seed_data(config: Config, seed: int, pooled=None):
  """(training clients, new clients) of one seed: ClientDatasets of the training classes
  over num_clients clients (`partition.classes`: S classes each, log-normal sizes; `run`
  adds the validation split), and of config.finetune_clients new clients, each with its own
  draw without replacement of finetune_samples training and (at most) finetune_test test
  samples of the new classes (numpy's default_rng([seed, 1])). pooled: `femnist_arrays`'
  (letters, digits) for dataset=femnist; digits: its split of `seed` (`digits.load`)."""
  n, s = setting(config)
  if config.dataset == "femnist":
    (x, y, x_test, y_test), (nx, ny, nx_test, ny_test) = pooled
  else:
    x_all, y_all, x_test_all, y_test_all = digits.load(seed)
    seen = digits.NUM_CLASSES - config.unseen_classes
    train, test = y_all < seen, y_test_all < seen
    x, y, x_test, y_test = x_all[train], y_all[train], x_test_all[test], y_test_all[test]
    nx, ny, nx_test, ny_test = (x_all[~train], y_all[~train], x_test_all[~test],
                                y_test_all[~test])
  parts, test_parts = partition_lib.classes(y, y_test, n, s, seed, config.size_sigma)
  clients = federated.client_datasets(x, y, parts, x_test, y_test, test_parts, NUM_CLASSES)
  if config.finetune_samples > len(ny):
    raise cfg.ConfigError(f"finetune_samples={config.finetune_samples} is more than the "
                          f"{len(ny)} training samples of the new classes")
  rng = np.random.default_rng([seed, 1])  # apart from the partition's stream
  draws = [(rng.choice(len(ny), config.finetune_samples, replace=False),
            rng.choice(len(ny_test), min(config.finetune_test, len(ny_test)), replace=False))
           for _ in range(config.finetune_clients)]
  new = federated.client_datasets(nx, ny, [np.sort(a) for a, _ in draws], nx_test, ny_test,
                                  [np.sort(b) for _, b in draws], NUM_CLASSES)
  return clients, new


@loop.jit_by_algorithm(static_argnames=("algorithm", "epochs"))
def fine_tuned(algorithm, state, new, hparams, keys, *, epochs: tuple):
  """The new clients' accuracy after each epoch count of `epochs`: {test_accuracy,
  test_accuracy_std (over the new clients)} [R, E] of final states `state` (leaves [R, ...]:
  R runs of `algorithm`) on new clients `new` ([R, J, ...]) with adaptation keys [R]: the
  algorithm's `new_clients` (the same key for every epoch count, so each count's SGD is the
  first epochs of the longest one's: `train.sgd_epochs`' keys are prefixes of each other)."""

  def one(state, new, key):
    results = [algorithm.new_clients(state, new, hparams, key, e) for e in epochs]
    return {k: jnp.stack([r[k] for r in results]) for k in ("test_accuracy",
                                                            "test_accuracy_std")}

  return jax.vmap(one)(state, new, keys)


def run(config: Config, seeds: int, batch) -> list[dict]:
  """Rows of every algorithm of config.algorithms: its training (`summaries.rows`) and its
  new clients' accuracy after each epoch count (`finetune_rows`)."""
  seed_values = config.seed_values(seeds)
  pooled = femnist_arrays(config) if config.dataset == "femnist" else None
  per_seed = {s: seed_data(config, s, pooled) for s in seed_values}
  clients = neural.stacked_datasets(config, [{"seed": s} for s in seed_values],
                                    lambda run: per_seed[run["seed"]][0])
  new = tree.stack([per_seed[s][1] for s in seed_values])
  model = models.make_model("mlp" if config.dataset == "femnist" else "digits-mlp",
                            NUM_CLASSES, precision=config.precision)
  count = neural.training_count(config, setting(config)[0])
  keys = neural.run_keys(seed_values)
  tuning_keys = shared.seed_keys(config.seed, seeds)[:, 1]  # the seeds' data keys
  hparams = neural.hparams(config)
  peers = [neural.algorithm(name, config, model, count) for name in config.algorithms]
  rows = []
  for name in config.algorithms:
    own = neural.algorithm(name, config, model, count)
    program, program_hparams = neural.shared_program(config, own, hparams, peers, clients)

    def keep(state, program=program, program_hparams=program_hparams):
      return jax.device_get(fine_tuned(program, state, new, program_hparams, tuning_keys,
                                       epochs=config.finetune_epochs))

    result = batch.train(name, neural.with_new_clients(program, config, clients), clients,
                         [program_hparams], keys, config.rounds, eval_every=config.eval_every,
                         keep=keep, members=[shared.members(name, seed_values)])[0]
    rows += summaries.rows(name, seed_values, result)
    rows += finetune_rows(name, seed_values, result, config)
  return rows


def finetune_rows(name: str, seed_values: list[int], result: dict, config: Config):
  """metrics.csv rows of the new clients of algorithm `name`: per seed and epoch count
  (finetune_epochs), new_client_accuracy (the mean over the new clients) and
  new_client_accuracy_std (their std), at the final round; NaN where the run diverged."""
  accuracy, spread = (shared.nan_where_diverged(result[k], result["metrics"])
                      for k in ("test_accuracy", "test_accuracy_std"))
  return [{"algorithm": name, "seed": seed, "round": config.rounds, "finetune_epochs": e,
           "new_client_accuracy": float(accuracy[s, j]),
           "new_client_accuracy_std": float(spread[s, j])}
          for s, seed in enumerate(seed_values) for j, e in enumerate(config.finetune_epochs)]


def summarize(rows, config: Config) -> list[dict]:
  """fig6.csv: per algorithm and epoch count, the new clients' accuracy (the mean over the
  seeds whose run did not diverge, `seeds` of them, and its std over them), beside the
  algorithm's test accuracy on its training clients (`summaries.summary`: config.summary's
  statistic, e.g. the mean of the last 10 evaluations, averaged over the same seeds)."""
  trained = {e["algorithm"]: e for e in summaries.summary(rows, config.algorithms,
                                                          config.summary)}
  out = []
  for name in config.algorithms:
    for epochs in config.finetune_epochs:
      values = [r["new_client_accuracy"] for r in rows if r["algorithm"] == name
                and r.get("finetune_epochs") == epochs and np.isfinite(r["new_client_accuracy"])]
      out.append({"algorithm": name, "finetune_epochs": epochs,
                  "new_client_accuracy": float(np.mean(values)) if values else np.nan,
                  "new_client_accuracy_std_over_seeds": float(np.std(values)) if values
                  else np.nan,
                  "seeds": len(values), "diverged": trained[name]["diverged"],
                  "training_test_accuracy": trained[name]["test_accuracy"],
                  "statistic": trained[name]["statistic"]})
  return out


def plot(rows, config: Config, file) -> None:
  """Left: each algorithm's test accuracy on its training clients vs rounds; right (Fig. 6):
  the new clients' test accuracy vs epochs of fine-tuning; mean over seeds, min-max band."""
  fig, (training, transfer) = plotting.figure(2, width=5.2, height=4.0)
  trained = [r for r in rows if "train_loss" in r]
  grid = any("grid" in r for r in rows)  # a --grid: line styles tell its combinations apart
  for i, name in enumerate(config.algorithms):
    # Else line styles apart: methods with one global model (FedAvg, APFL's w) coincide.
    style = None if grid else {"color": f"C{i % 10}",
                               "ls": plotting.LINESTYLES[i % len(plotting.LINESTYLES)]}
    plotting.line(training, trained, "round", "test_accuracy", legend_label(name),
                  style=style, algorithm=name)
    plotting.line(transfer, rows, "finetune_epochs", "new_client_accuracy",
                  legend_label(name), style=style, algorithm=name)
  old, new = (("letters A-J", "digits 0-9") if config.dataset == "femnist" else
              (f"classes 0-{9 - config.unseen_classes}",
               f"classes {10 - config.unseen_classes}-9"))
  training.set(xlabel="round", ylabel=f"test accuracy (training clients, {old})",
               title="training")
  transfer.set(xscale="log", xlabel="epochs of fine-tuning on the new client's samples",
               ylabel=f"new clients' test accuracy ({new})",
               title=f"new clients ({config.finetune_samples} samples each)")
  transfer.set_xticks(config.finetune_epochs, [str(e) for e in config.finetune_epochs])
  n, s = setting(config)
  mock = " (MOCK DATA)" if mock_data(config) else ""
  fig.suptitle(f"FedRep Fig. 6 on {TITLES[config.dataset]}{mock}: n={n}, S={s}, "
               f"r={config.participation}, {config.rounds} rounds; "
               f"{neural.conventions_text(config)}{neural.options_text(config)}")
  plotting.save(fig, file)


def legend_label(name: str) -> str:
  """An algorithm's label, with how its new clients adapt where that is not a head on the
  frozen server body (`OWN_RULES`)."""
  rule = OWN_RULES.get(name)
  return labels.label(name) + (f" ({rule})" if rule else "")


def mock_data(config: Config) -> str | None:
  """What dataset=femnist, source=mock trains on instead of FEMNIST; None otherwise."""
  return table.mock_data(config, "FEMNIST") if config.dataset == "femnist" else None


RECIPE = register(Recipe(
    name="fedrep-fig6", rank=36,
    docs="docs/papers/fedrep.md#fig-6-new-clients-from-another-dataset-fedrep-fig6",
    summary="FedRep Fig. 6: new clients of unseen classes fine-tune a head on each method's "
            "frozen representation; accuracy vs fine-tuning epochs (digits offline, or FEMNIST "
            "letters -> digits)",
    config=Config,
    quick={"rounds": 20, "num_clients": 10, "participation": 0.3, "finetune_epochs": (1, 10),
           "finetune_clients": 2, "finetune_samples": 100, "finetune_test": 100},
    run=run, plot=plot, default_seeds=3, summarize=summarize, summary_file="fig6.csv",
    mock_data=mock_data))
