"""fedrep-table1-{cifar10, cifar100, femnist, sent140}: FedRep's Table 1 (Section 5.2) on
real data, every algorithm of the table, the paper's number beside the measured one.

- CIFAR-10 (n, S) in (100, 2), (100, 5), (1000, 2) and CIFAR-100 (100, 5), (100, 20):
  tfds files; each client holds S class shards (`partition.classes`) with 50,000/n
  training samples, its test samples from the same labels; FedRep's CNNs. `--set
  dataset=NAME` runs the same settings on any registered dataset (`data.datasets`: a
  --plugin file's too), with its model.
- FEMNIST: LEAF's files, letters A-J, re-split over n = 150 clients with S = 3 letters
  each and log-normal sizes (`size_sigma` 0.5); the MLP; 200 rounds.
- Sent140: LEAF's users as clients (n = 183), tweets as 25 padded token ids (a vocabulary
  of 10,000 words); the LSTM, with GloVe embeddings where the file is present; 50 rounds.
With source=files (the default) a missing dataset stops the run before any work with the
command that prepares it. --quick runs a few algorithms on random mock data in the same
formats, offline; its accuracies mean nothing.
"""

import dataclasses
import tempfile

from fedjax_rep.data import datasets, leaf
from fedjax_rep.nn import models
from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import summaries
from fedjax_rep.recipes.kit import table
from fedjax_rep.recipes.fedrep import paper
from fedjax_rep.experiments.recipe_registry import Recipe, register

QUICK_ALGORITHMS = ("local", "fedavg-ft", "fedrep")


@dataclasses.dataclass(frozen=True)
class CifarConfig(table.ShardConfig):
  """CIFAR-10 or CIFAR-100 (each recipe's `Recipe.defaults` sets its dataset and settings),
  or any registered dataset (`--set dataset=NAME`)."""
  algorithms: tuple = neural.algorithms(paper.DEFAULT_ALGORITHMS)
  dataset: str = neural.dataset("cifar10")

  def check(self):
    table.check_dataset(self)


@dataclasses.dataclass(frozen=True)
class FemnistConfig(table.ShardConfig):
  algorithms: tuple = neural.algorithms(paper.DEFAULT_ALGORITHMS)
  num_clients: tuple = cfg.positive_int("number of clients n of each setting", (150,),
                                        sequence=True)
  classes_per_client: tuple = cfg.positive_int(
      "letters per client S of each setting (paired with num_clients)", (3,), sequence=True)
  size_sigma: float = cfg.nonnegative_float("log-normal spread of client sizes", 0.5)
  samples_per_client: int = cfg.positive_int(
      "mean training samples per client (the pooled letters are subsampled to n times it)",
      148)
  rounds: int = cfg.rounds(200)
  mock_examples: int = cfg.positive_int("training images per user of the mock data", 600)
  averaging: str | None = table.leaf_averaging()

  def check(self):
    super().check()
    if self.source == "files":
      leaf.require("femnist", None)


@dataclasses.dataclass(frozen=True)
class Sent140Config(table.Fields):
  algorithms: tuple = neural.algorithms(paper.DEFAULT_ALGORITHMS)
  num_clients: int = cfg.num_clients(183)
  max_len: int = cfg.positive_int("tokens per tweet (longer ones are cut, shorter padded)", 25)
  vocab_size: int = cfg.positive_int("vocabulary: the most frequent words of the clients' "
                                     "training tweets", 10000, low=2)
  glove: str = cfg.choice("GloVe embeddings: used when the file is present (auto), or never",
                          "auto", ("auto", "off"))
  rounds: int = cfg.rounds(50)
  source: str = table.source()
  mock_examples: int = cfg.positive_int("training tweets per user of the mock data", 40)
  averaging: str | None = table.leaf_averaging()

  def check(self):
    if self.source == "files":
      leaf.require("sent140", None)


TITLES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}  # other datasets: their names


def cifar_named(config: CifarConfig) -> tuple[str, str]:
  """(dataset, title) of config's dataset: e.g. ("cifar10", "CIFAR-10")."""
  return config.dataset, TITLES.get(config.dataset, config.dataset)


def _leaf_directory(dataset: str, config, users: int, tmp: str) -> str | None:
  """None (LEAF's default location) for source=files, else a mock dataset written in tmp."""
  if config.source == "files":
    return None
  return leaf.write_example(dataset, tmp, users, config.mock_examples, seed=config.seed)


def femnist_run(config: FemnistConfig, seeds, batch, grid=None) -> list[dict]:
  with tempfile.TemporaryDirectory() as tmp:
    directory = _leaf_directory("femnist", config, 3 * max(config.num_clients), tmp)
    arrays = datasets.subsample(leaf.femnist_pooled(leaf.FEMNIST_LETTERS, directory),
                                max(config.num_clients) * config.samples_per_client,
                                config.seed)
  return table.shard_run(config, seeds, batch, arrays,
                          models.make_model("mlp", len(leaf.FEMNIST_LETTERS),
                                            precision=config.precision), grid)


def sent140_run(config: Sent140Config, seeds, batch, grid=None) -> list[dict]:
  """The users (so the vocabulary) are drawn once, from config.seed; seeds vary training."""
  glove_present, glove_path = leaf.glove_status()
  use_glove = config.glove == "auto" and glove_present
  print("sent140: " + (f"GloVe embeddings from {glove_path}" if use_glove else
                       "trainable embeddings from a random init"
                       + ("" if config.glove == "off" else f" (no GloVe file at {glove_path})")))
  with tempfile.TemporaryDirectory() as tmp:
    directory = _leaf_directory("sent140", config, config.num_clients, tmp)
    data, vocab_size, embeddings = leaf.sent140_natural(
        config.num_clients, config.seed, config.max_len, config.vocab_size,
        glove_path=glove_path if use_glove else None, directory=directory)
  model = models.make_model("sent140-lstm", 2, vocab_size=vocab_size, embeddings=embeddings,
                             precision=config.precision)
  return table.run(config, seeds, batch, sent140_settings(config), lambda run: data, model,
                   grid)


def sent140_settings(config: Sent140Config) -> list[dict]:
  return [{"num_clients": config.num_clients}]


def _register(name: str, named, config, run, settings, quick: dict, summary: str,
              defaults: dict, mock_data):
  """Registers recipe fedrep-table1-`name`; named(config) -> (its dataset, its title);
  mock_data(config, title) -> `Recipe.mock_data`'s text."""
  def summarize(rows, config):
    return table.table(rows, config, named(config)[0], settings(config), paper.PAPER)

  def plot(rows, config, file):
    dataset, title = named(config)
    table.plot(rows, config, file, dataset, settings(config),
               f"{title}{' (MOCK DATA)' if mock_data(config, title) else ''}: "
               f"r={config.participation}, {config.rounds} rounds", paper.PAPER,
               "FedRep Table 1")

  register(Recipe(name=f"fedrep-table1-{name}", summary=summary, config=config,
                  defaults=defaults,
                  quick={"source": "mock", "algorithms": QUICK_ALGORITHMS, **quick},
                  run=run, plot=plot, default_seeds=1, summarize=summarize,
                  summary_file="table1.csv",
                  mock_data=lambda config: mock_data(config, named(config)[1]), rank=140,
                  traced=neural.traced_keys, summary_only=summaries.COST, searchable=True,
                  privacy=True,
                  docs="docs/papers/fedrep.md#table-1-neural-networks-on-real-data"))


_QUICK_SHARDS = {"rounds": 3, "eval_every": 1, "client_group": 1}
_register("cifar10", cifar_named, CifarConfig, table.dataset_run, table.shard_settings,
          {**_QUICK_SHARDS, "num_clients": (10, 10), "classes_per_client": (2, 5)},
          "FedRep Table 1, CIFAR-10 (n, S) = (100, 2), (100, 5), (1000, 2): all algorithms "
          "(tfds files)",
          {"dataset": "cifar10", "num_clients": (100, 100, 1000),
           "classes_per_client": (2, 5, 2)}, table.dataset_mock_data)
_register("cifar100", cifar_named, CifarConfig, table.dataset_run, table.shard_settings,
          {**_QUICK_SHARDS, "num_clients": (10, 10), "classes_per_client": (5, 20),
           "mock_examples": 1000, "rounds": 2},
          "FedRep Table 1, CIFAR-100 (n, S) = (100, 5), (100, 20): all algorithms (tfds files)",
          {"dataset": "cifar100", "num_clients": (100, 100), "classes_per_client": (5, 20)},
          table.dataset_mock_data)
_register("femnist", lambda config: ("femnist", "FEMNIST (10 letters)"), FemnistConfig,
          femnist_run, table.shard_settings,
          {**_QUICK_SHARDS, "num_clients": (10,), "samples_per_client": 20,
           "mock_examples": 100},
          "FedRep Table 1, FEMNIST: 10 letters, n = 150, S = 3, log-normal sizes (LEAF files)",
          {}, table.mock_data)
_register("sent140", lambda config: ("sent140", "Sent140"), Sent140Config, sent140_run,
          sent140_settings,
          {"rounds": 3, "eval_every": 1, "client_group": 1, "num_clients": 10,
           "vocab_size": 50},
          "FedRep Table 1, Sent140: its users as clients (n = 183), an LSTM (LEAF files)", {},
          table.mock_data)
