"""digits-personalized: personalised FL on real data that ships offline (the default
neural demo): FedRep vs FedPer vs LG-FedAvg vs FedAvg vs FedAvg-FT vs local only.

Data: scikit-learn's digits (1,797 8x8 images, 10 classes), 25% of each class held out for
testing, over 50 clients with 2 class shards each (FedRep's shard scheme,
`partition.classes`; `partition=dirichlet|iid` for the others). FedRep's CIFAR schedule
(Section 5.2: r = 0.1, 10 head epochs + 1 body epoch, SGD with momentum 0.5, weight decay
1e-4, batch 10) with the MLP 64-64-32 + head (`model=digits-cnn` for a CNN), lr 0.05, 100
rounds. FedAvg-FT fine-tunes the head for `head_epochs` epochs before each evaluation;
local only trains a client whenever it is sampled. Accuracy is the mean over clients of
each client's test accuracy with its own parameters, every `eval_every` rounds; the
summary is the mean of the last 10 evaluations. `--set algorithms=...` takes any neural
algorithm of the registry (`fedjax-rep list`), with its options' defaults; `--set
dataset=...` any registered dataset (`data.datasets`: a --plugin file's too), with its model.
"""

import dataclasses

from fedjax_rep.data import datasets, federated
from fedjax_rep.data import partition as partition_lib
from fedjax_rep.nn import models
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import summaries
from fedjax_rep.experiments import plotting
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(neural.Training):
  dataset: str = neural.dataset("digits")
  num_clients: int = cfg.num_clients(50)
  partition: str = neural.partition()
  classes_per_client: int = neural.classes_per_client(2)
  dirichlet_alpha: float = neural.dirichlet_alpha()
  lr: float = cfg.lr(0.05, "step size of local SGD")
  model: str | None = cfg.setting(None, cfg.Check(str, choices=tuple(models.MODELS),
                                                   optional=True, auto="the dataset's"),
                                   "the network (e.g. digits-cnn on digits)")
  algorithms: tuple = neural.algorithms()

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


def data(config: Config, seed_values):
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


def run(config: Config, seeds: int, batch, grid=None) -> list[dict]:
  seed_values = config.seed_values(seeds)
  clients = data(config, seed_values)
  model = neural.dataset_model(config.dataset, clients.input_spec(runs=1).shape,
                               config.precision, config.model)
  rows = []
  for name in config.algorithms:
    results = neural.trained(batch, name, name, config, model, clients,
                             neural.run_keys(seed_values), config.num_clients, grid,
                             runs=[{"seed": s} for s in seed_values])
    for combination, result in zip(grid or [{}], results):
      rows += summaries.rows(name, seed_values, result, **combination)
  return rows


def plot(rows, config: Config, file) -> None:
  fig, (acc, loss) = plotting.figure(2, width=5.2, height=3.8)
  for name in config.algorithms:
    plotting.line(acc, rows, "round", "test_accuracy", labels.label(name), algorithm=name)
    plotting.line(loss, rows, "round", "train_loss", labels.label(name), algorithm=name)
  acc.set(xlabel="communication round", ylabel="test accuracy (mean over clients)")
  loss.set(xlabel="communication round", ylabel="local training loss", yscale="log")
  split = (f"{config.classes_per_client} class shards/client" if config.partition == "classes"
           else f"Dir({config.dirichlet_alpha})" if config.partition == "dirichlet" else "iid")
  model = config.model or datasets.lookup(config.dataset).model or "its model by input shape"
  fig.suptitle(f"{config.dataset}, {model}: n={config.num_clients}, {split}, "
               f"r={config.participation}, {config.head_epochs}+{config.local_epochs} epochs"
               f"{neural.options_text(config)}")
  plotting.save(fig, file)


def summarize(rows, config: Config):
  return summaries.summary(rows, config.algorithms, config.summary)


RECIPE = register(Recipe(
    name="digits-personalized",
    rank=120,
    docs="docs/neural.md#the-offline-demo-digits-personalized",
    summary="personalised FL on sklearn digits (offline): FedRep, FedPer, LG-FedAvg, FedAvg, "
            "FedAvg-FT, local; test accuracy vs rounds",
    config=Config, quick={"rounds": 40}, run=run, plot=plot, default_seeds=3,
    summarize=summarize, traced=neural.traced_keys, summary_only=summaries.COST))
