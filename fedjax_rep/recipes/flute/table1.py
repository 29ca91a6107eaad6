"""flute-table1: FLUTE's Table 1 (Liu, Shen, Yang, ICML 2024, Section 6): general FLUTE
and FLUTE* against FedRep, FedRep*, FedRoD, FedCP, FedPer, LG-FedAvg, FedAvg and FedAvg-FT
(and FedBABU, not in the paper), test accuracy and the neural-collapse metrics (Global
NC2, Averaged Local NC2) of FLUTE's App. C.2.

Partitions (M clients, m class shards each, `partition.classes`): CIFAR-10 (50, 2),
(50, 5), (100, 2), (100, 5) and CIFAR-100 (100, 5), (100, 10), (100, 20), (100, 40), from
the tfds files (`dataset=cifar10|cifar100`); FedRep's CNNs and schedule (r = 0.1, SGD lr
0.01, momentum 0.5, weight decay 1e-4, batch 10, 100 rounds). Epochs as FLUTE's Sec. 7.2
on CIFAR-10: FedRep 1 head + 1 body epoch, FedRep* 10 + 1, FLUTE 1 joint epoch, FLUTE*
1 joint + 10 head; the others `local_epochs`; FedAvg-FT fine-tunes the head and FedBABU
the whole model for `head_epochs` before testing. `--quick`: scikit-learn's digits, 20
clients with 2 and 5 classes each (FedBABU only with `--set algorithms=...`); `dataset`
takes any registered dataset (`data.datasets`: a --plugin file's too), with its model.
table1.csv has FLUTE's Table 1 number beside the measured one where the paper has it.
"""

import dataclasses

from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import summaries
from fedjax_rep.recipes.kit import table
from fedjax_rep.experiments.recipe_registry import Recipe, register

DEFAULT_ALGORITHMS = ("fedavg", "fedavg-ft", "lg-fedavg", "fedper", "fedrep", "fedrep-star",
                      "fedrod", "fedcp", "flute", "flute-star", "fedbabu")
QUICK_ALGORITHMS = tuple(a for a in DEFAULT_ALGORITHMS if a != "fedbabu")  # FLUTE's Table 1's own

# FLUTE Table 1, test accuracy in % (FedBABU is not in it).
_COLUMNS = (("cifar10", 50, 2), ("cifar10", 50, 5), ("cifar10", 100, 2), ("cifar10", 100, 5),
            ("cifar100", 100, 5), ("cifar100", 100, 10), ("cifar100", 100, 20),
            ("cifar100", 100, 40))
_TABLE = {
    "fedavg": (34.460, 47.217, 41.584, 51.876, 20.212, 31.533, 34.659, 32.902),
    "fedavg-ft": (83.996, 71.465, 84.688, 70.884, 78.342, 66.660, 54.464, 44.858),
    "lg-fedavg": (82.724, 61.820, 83.019, 62.957, 72.526, 53.526, 34.445, 22.702),
    "fedper": (85.173, 74.015, 86.168, 73.666, 76.001, 67.100, 56.066, 44.689),
    "fedrep": (86.133, 71.737, 86.685, 73.808, 78.621, 68.530, 56.360, 43.061),
    "fedrep-star": (87.320, 75.766, 87.177, 75.296, 78.892, 68.630, 56.654, 42.025),
    "fedrod": (79.476, 68.728, 83.296, 72.116, 74.299, 66.462, 57.280, 48.120),
    "fedcp": (85.361, 71.603, 84.798, 71.344, 74.266, 66.426, 57.067, 43.638),
    "flute": (87.012, 76.478, 86.128, 76.918, 77.750, 70.598, 59.243, 48.169),
    "flute-star": (87.713, 76.543, 88.567, 78.255, 79.560, 70.844, 59.714, 48.170),
}
PAPER = {column: {name: row[j] / 100 for name, row in _TABLE.items()}
         for j, column in enumerate(_COLUMNS)}
SETTINGS = {"cifar10": ((50, 50, 100, 100), (2, 5, 2, 5)),
            "cifar100": ((100, 100, 100, 100), (5, 10, 20, 40))}


@dataclasses.dataclass(frozen=True)
class Config(table.ShardConfig):
  dataset: str = neural.dataset("cifar10", "the data: tfds files of CIFAR-10/100, "
                                "scikit-learn's digits (offline), or any registered dataset "
                                "(fedjax-rep list)")
  num_clients: tuple = cfg.positive_int(
      "number of clients M of each setting (default: the paper's CIFAR-10 settings; "
      "CIFAR-100's are 100,100,100,100 with classes_per_client=5,10,20,40)",
      SETTINGS["cifar10"][0], sequence=True)
  classes_per_client: tuple = cfg.positive_int(
      "classes per client m of each setting (paired with num_clients)",
      SETTINGS["cifar10"][1], sequence=True)
  algorithms: tuple = neural.algorithms(DEFAULT_ALGORITHMS)
  head_epochs: int = cfg.positive_int("FedRep's head epochs per round (FedRep* and FLUTE*: "
                                      "10); also FedAvg-FT's fine-tuning epochs", 1)

  def check(self):
    table.check_dataset(self)


def settings(config: Config) -> list[dict]:
  return table.shard_settings(config)


def summarize(rows, config: Config):
  return table.table(rows, config, config.dataset, settings(config), PAPER)


def mock_data(config: Config) -> str | None:
  """What config trains on instead of its dataset with source=mock (`Recipe.mock_data`); None
  on the files or on a dataset without a mock, e.g. digits (real data, whatever the
  source)."""
  return table.dataset_mock_data(config, config.dataset)


def plot(rows, config: Config, file) -> None:
  table.plot(rows, config, file, config.dataset, settings(config),
              f"FLUTE Table 1, {config.dataset}{' (MOCK DATA)' if mock_data(config) else ''}: "
              f"r={config.participation}, {config.rounds} rounds", PAPER, "FLUTE Table 1")


RECIPE = register(Recipe(
    name="flute-table1",
    rank=150,
    docs="docs/papers/flute.md#table-1-neural-networks-flute-table1",
    summary="FLUTE Table 1: FLUTE, FLUTE*, FedRep, FedRep*, FedRoD, FedCP, FedPer, LG-FedAvg, "
            "FedAvg(-FT), + FedBABU on CIFAR-10/100 partitions (tfds files; --quick: digits)",
    config=Config,
    quick={"dataset": "digits", "num_clients": (20, 20), "classes_per_client": (2, 5),
           "rounds": 40, "eval_every": 2, "lr": 0.05, "client_group": 1,
           "algorithms": QUICK_ALGORITHMS},
    run=table.dataset_run, plot=plot, default_seeds=1, summarize=summarize,
    summary_file="table1.csv",
    mock_data=mock_data, traced=neural.traced_keys, summary_only=summaries.COST,
    searchable=True, privacy=True))
