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

from fedjax_rep.data import datasets, new_clients
from fedjax_rep.experiments import labels
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import partitioned
from fedjax_rep.recipes.kit import summaries
from fedjax_rep.experiments import plotting
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(partitioned.Partitioned):
  algorithms: tuple = neural.algorithms()


def run(config: Config, seeds: int, batch, grid=None) -> list[dict]:
  seed_values = config.seed_values(seeds)
  clients = partitioned.data(config, seed_values)
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
  held = bool(config.new_clients)
  fig, (acc, loss, *new) = plotting.figure(3 if held else 2, width=5.2, height=3.8)
  for name in config.algorithms:
    plotting.line(acc, rows, "round", "test_accuracy", labels.label(name), algorithm=name)
    plotting.line(loss, rows, "round", "train_loss", labels.label(name), algorithm=name)
    if held:
      plotting.line(new[0], rows, "round", "new_accuracy", labels.label(name), algorithm=name)
  acc.set(xlabel="communication round", ylabel="test accuracy (mean over "
          + ("training clients)" if held else "clients)"))
  loss.set(xlabel="communication round", ylabel="local training loss", yscale="log")
  if held:
    new[0].set(xlabel="communication round",
               ylabel=f"new clients' accuracy after {config.new_epochs} epochs")
  split = (f"{config.classes_per_client} class shards/client" if config.partition == "classes"
           else f"Dir({config.dirichlet_alpha})" if config.partition == "dirichlet" else "iid")
  model = config.model or datasets.lookup(config.dataset).model or "its model by input shape"
  new_text = (f", {new_clients.count(config.new_clients, config.num_clients)} of them new"
              if held else "")
  fig.suptitle(f"{config.dataset}, {model}: n={config.num_clients}{new_text}, {split}, "
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
    summarize=summarize, traced=neural.traced_keys, summary_only=summaries.COST,
    searchable=True, privacy=True))
