"""A registered dataset partitioned over clients, as the neural recipes on one federation
take it: the configuration fields (`Partitioned`: the dataset, n, the partition, the model)
and every seed's clients (`data`)."""

import dataclasses

from fedjax_rep.data import datasets, federated
from fedjax_rep.data import partition as partition_lib
from fedjax_rep.nn import models
from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.kit import neural


@dataclasses.dataclass(frozen=True)
class Partitioned(neural.Training):
  """`neural.Training` on registered dataset `dataset` split over `num_clients` clients by
  `partition` (digits by default: 50 clients of 2 class shards, lr 0.05)."""
  dataset: str = neural.dataset("digits")
  num_clients: int = cfg.num_clients(50)
  partition: str = neural.partition()
  classes_per_client: int = neural.classes_per_client(2)
  dirichlet_alpha: float = neural.dirichlet_alpha()
  lr: float = cfg.lr(0.05, "step size of local SGD")
  model: str | None = cfg.setting(None, cfg.Check(str, choices=tuple(models.MODELS),
                                                   optional=True, auto="the dataset's"),
                                   "the network (e.g. digits-cnn on digits)")

  def check(self):
    """The dataset's files must be there and the partition possible on it (checked on the
    labels: no training)."""
    neural.check_dataset(self.dataset)
    _, y, _, y_test = datasets.arrays(self.dataset, self.seed)
    try:
      partition_lib.partition(self.partition, y, y_test, num_clients=self.num_clients,
                              seed=self.seed, classes_per_client=self.classes_per_client,
                              dirichlet_alpha=self.dirichlet_alpha)
    except ValueError as error:
      raise cfg.ConfigError(f"{error} ({self.dataset} has {len(y)} training samples, "
                            f"{datasets.lookup(self.dataset).num_classes} classes)") from None


def data(config: Partitioned, seed_values):
  """The clients of every seed (the seed draws the partition, and the split of a seeded
  dataset such as digits), with config's validation split, stacked along a leading seed
  axis (`neural.stacked_datasets`)."""
  pooled = datasets.by_seed(config.dataset, config.seed)

  def dataset(run):
    x, y, x_test, y_test = pooled(run["seed"])
    parts, test_parts = partition_lib.partition(
        config.partition, y, y_test, num_clients=config.num_clients, seed=run["seed"],
        classes_per_client=config.classes_per_client, dirichlet_alpha=config.dirichlet_alpha)
    return federated.client_datasets(x, y, parts, x_test, y_test, test_parts,
                                     datasets.lookup(config.dataset).num_classes)

  return neural.stacked_datasets(config, [{"seed": s} for s in seed_values], dataset)
