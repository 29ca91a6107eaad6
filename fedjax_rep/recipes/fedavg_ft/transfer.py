"""What fedavg-ft-fig2 and fedavg-ft-fig5 share: FedAvg and D-SGD (`compared`) trained on
one dataset, then fine-tuned on new clients from another (FedAvg-FT paper, Figs. 2 and 5
right: trained on CIFAR-100, fine-tuned on CIFAR-10).

Training data: `dataset` split over n clients with S class shards each (`partition.classes`,
the paper's "C classes per client"). New clients: `transfer_clients` per seed, each with
its own random draw of `new_dataset`'s training split (every class; a larger sample count
extends a smaller one's draw) and tested on its own random draw of up to `new_test_samples`
of its test split. Offline (the default), `new_dataset=transformed` is `dataset` itself made
into another dataset (`transformed`): every image mirrored left-right and its intensities
inverted (x -> 1 - x), and every label shifted by half the classes (y -> (y + C/2) mod C),
so that strokes stay strokes but no pixel nor class means what it meant in training. A new
client fine-tunes the whole model, as the paper's clients fine-tune theta_T (`fine_tuned`):
`finetune_epochs` of SGD (the training's lr, batch size and weight decay) on its training
samples, from the global model, its head included.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import tree
from fedjax_rep.data import datasets, federated
from fedjax_rep.data import partition as partition_lib
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.experiments import plotting
from fedjax_rep.nn import evaluation, train
from fedjax_rep.recipes.fedavg_ft import compared
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import shared

TRANSFORMED = "transformed"  # new_dataset: `dataset` mirrored, inverted and relabelled
MODELS = ("auto", "digits-mlp", "digits-cnn", "cifar10-cnn", "cifar100-cnn", "mlp")


@dataclasses.dataclass(frozen=True)
class Config(compared.Training):
  """The training of `compared.Training` on `dataset` (S class shards per client), and the
  new clients from `new_dataset` that fine-tune its final models."""
  dataset: str = neural.dataset(
      "digits", "the training data: any registered image dataset (digits offline; cifar100, "
      "the paper's, once prepared: fedjax-rep data)")
  new_dataset: str = cfg.choice(
      "the new clients' data: transformed (the training dataset mirrored, inverted and "
      "relabelled: offline) or a registered dataset of the same image shape (cifar10, the "
      "paper's)", TRANSFORMED, lambda: (TRANSFORMED, *datasets.names()))
  classes_per_client: int = neural.classes_per_client(2)
  model: str = cfg.choice("the network (auto: the dataset's own, e.g. digits-mlp for digits, "
                          "cifar100-cnn for cifar100)", "auto", MODELS)
  finetune_epochs: int = cfg.positive_int("epochs of SGD of each new client on the whole "
                                          "model (the paper's 10)", 10)
  transfer_clients: int = cfg.positive_int("new clients per seed, from new_dataset (the "
                                           "paper's five per trial)", 5)
  new_test_samples: int = cfg.positive_int("test samples of each new client, its own draw of "
                                           "new_dataset's test split (all where it has "
                                           "fewer)", 1000)

  def check(self):
    """The datasets' files present (DataMissing otherwise), the new dataset's classes within
    the model's outputs, and on digits the partition possible and the new clients' samples
    there (checked on the labels: no training)."""
    neural.check_dataset(self.dataset)
    if self.new_dataset != TRANSFORMED:
      neural.check_dataset(self.new_dataset)
    classes = datasets.lookup(self.dataset).num_classes
    new = classes if self.new_dataset == TRANSFORMED else (
        datasets.lookup(self.new_dataset).num_classes)
    if new > classes:
      raise cfg.ConfigError(f"new_dataset={self.new_dataset} has {new} classes, more than "
                            f"the {classes} outputs of a model trained on {self.dataset}")
    if self.classes_per_client > classes:
      raise cfg.ConfigError(f"classes_per_client={self.classes_per_client} is more than the "
                            f"{classes} classes of {self.dataset}")
    if self.dataset != "digits" or self.new_dataset not in (TRANSFORMED, "digits"):
      return  # other datasets are checked when loaded, before any training
    _, y, _, y_test = datasets.arrays("digits", self.seed)
    if max(self.samples()) > len(y):
      raise cfg.ConfigError(f"finetune_samples={max(self.samples())} is more than the "
                            f"{len(y)} training samples of the new dataset")
    try:
      partition_lib.partition("classes", y, y_test, num_clients=self.num_clients,
                              seed=self.seed, classes_per_client=self.classes_per_client)
    except ValueError as error:
      raise cfg.ConfigError(f"{error} (digits has {len(y)} training samples)") from None

  def samples(self) -> tuple[int, ...]:
    """The new clients' training sample counts (the recipe's `finetune_samples`)."""
    value = self.finetune_samples
    return tuple(value) if isinstance(value, tuple) else (value,)


def transformed(arrays: tuple, num_classes: int) -> tuple:
  """(x, y, x_test, y_test) of an image dataset (x [N, H, W, C] in [0, 1]) made into another:
  each image mirrored left-right and inverted (1 - x), each label y -> (y + C // 2) mod C."""
  x, y, x_test, y_test = arrays
  image = lambda a: (1.0 - a[..., ::-1, :]).astype(a.dtype)
  label = lambda a: ((a + num_classes // 2) % num_classes).astype(a.dtype)
  return image(x), label(y), image(x_test), label(y_test)


def new_arrays(config: Config, arrays: tuple, load) -> tuple:
  """The new dataset's (x, y, x_test, y_test) for the seed whose training arrays are
  `arrays` (transformed), or load() (another dataset); ValueError where its examples' shape
  is not the training dataset's or it has too few training samples."""
  if config.new_dataset == TRANSFORMED and arrays[0].ndim != 4:
    raise ValueError(f"new_dataset=transformed mirrors images [N, H, W, C]; {config.dataset}'s "
                     f"examples have shape {arrays[0].shape[1:]}: name a new_dataset")
  classes = datasets.lookup(config.dataset).num_classes
  new = transformed(arrays, classes) if config.new_dataset == TRANSFORMED else load()
  if new[0].shape[1:] != arrays[0].shape[1:]:
    raise ValueError(f"new_dataset={config.new_dataset}'s examples have shape "
                     f"{new[0].shape[1:]}, {config.dataset}'s {arrays[0].shape[1:]}: the model "
                     f"takes one shape")
  if max(config.samples()) > len(new[1]):
    raise ValueError(f"finetune_samples={max(config.samples())} is more than the "
                     f"{len(new[1])} training samples of new_dataset={config.new_dataset}")
  return new


def seed_data(config: Config, arrays: tuple, seed: int, probe_samples: int = 0, load=None):
  """(training clients, new clients, probe inputs) of one seed with the training dataset's
  arrays `arrays` (and load() the new dataset's, where it is another; None: its arrays of
  the seed): config.num_clients clients of config.classes_per_client class shards each;
  ClientDatasets [K, J, ...] of J = config.transfer_clients new clients for each of the K
  counts of `config.samples()` (client j's first k rows of its own shuffle of the new
  training split, padded to the largest k; tested on its own draw of up to
  config.new_test_samples of the new test split); the inputs of up to `probe_samples` rows of
  the new test split, a draw from the seed (the fixed probe set of fig2)."""
  x, y, x_test, y_test = arrays
  classes = datasets.lookup(config.dataset).num_classes
  parts, test_parts = partition_lib.partition(
      "classes", y, y_test, num_clients=config.num_clients, seed=seed,
      classes_per_client=config.classes_per_client)
  clients = federated.client_datasets(x, y, parts, x_test, y_test, test_parts, classes)
  nx, ny, nx_test, ny_test = new_arrays(
      config, arrays, load or (lambda: datasets.arrays(config.new_dataset, seed)))
  rng = np.random.default_rng([seed, 2])  # apart from the partition's stream
  orders = [rng.permutation(len(ny)) for _ in range(config.transfer_clients)]
  tests = [np.sort(rng.permutation(len(ny_test))[:config.new_test_samples])
           for _ in range(config.transfer_clients)]
  samples = config.samples()
  new = tree.stack([federated.client_datasets(
      nx, ny, [order[:k] for order in orders], nx_test, ny_test, tests, classes,
      size=max(samples)) for k in samples])
  return clients, new, nx_test[np.sort(rng.permutation(len(ny_test))[:probe_samples])]


def prepared(config: Config, seed_values: list[int], probe_samples: int = 0):
  """(training clients of every seed stacked as `neural.stacked_datasets` makes them, new
  clients [S, K, J, ...], probe inputs [S, P, ...], the model) of `config` (`seed_data`)."""
  load = datasets.by_seed(config.dataset, config.seed)
  load_new = None if config.new_dataset == TRANSFORMED else datasets.by_seed(
      config.new_dataset, config.seed)  # a dataset that is not seeded: loaded once
  per_seed = {s: seed_data(config, load(s), s, probe_samples,
                           load_new and (lambda s=s: load_new(s))) for s in seed_values}
  clients = neural.stacked_datasets(config, [{"seed": s} for s in seed_values],
                                    lambda run: per_seed[run["seed"]][0])
  new = tree.stack([per_seed[s][1] for s in seed_values])
  probe = np.stack([per_seed[s][2] for s in seed_values])
  model = neural.dataset_model(config.dataset, clients.input_spec(1).shape, config.precision,
                               None if config.model == "auto" else config.model)
  return clients, new, probe, model


def trained_and_analysed(config: Config, clients, model, keys, batch, analyse) -> tuple:
  """(metrics.csv rows of training, the final models, the analysis): `compared.train` of
  config's hparams on `clients` (keys [seeds, 3]), then the unit 'analysis':
  analyse(algorithm, final models stacked [A, ...], hparams) -> {name: [A, seeds, ...]}
  (one program for both final models: the last algorithm's structure serves both), NaN
  for the runs that diverged (`shared.nan_where_diverged`)."""
  hparams = neural.hparams(config)
  rows, finals, metrics, algorithm = compared.train(config, clients, model, [hparams], keys,
                                                    [{}], batch)
  analysis = batch.unit("analysis", lambda: jax.device_get(analyse(
      algorithm, tree.stack([f[0] for f in finals]), hparams)))
  analysis = {k: np.stack([shared.nan_where_diverged(v[a], m[0])
                           for a, m in enumerate(metrics)]) for k, v in analysis.items()}
  return rows, finals, analysis


def row_base(name: str, seed_value: int, config: Config) -> dict:
  """The columns of an analysis row of algorithm `name` on seed `seed_value`: algorithm,
  seed, its final round and its local steps (`compared`)."""
  return {"algorithm": name, "seed": seed_value, "round": compared.final_round(name, config),
          "local_steps": compared.local_steps(name, config)}


def fine_tuned(algorithm, flat: dict, new, hparams, key, epochs: int, measure=None) -> dict:
  """`evaluation.accuracy_metrics` of the new clients `new` (ClientDatasets [J, ...]) after
  each fine-tunes the whole model `flat` (the global model, flat params) for `epochs` epochs
  of SGD on its training samples (`algorithm.sgd` on the model's loss, from the i-th key of
  split(key, J)) and is tested on its test split; with measure(tuned params) -> an array,
  also its values for every client ([J, ...]) under "measure"."""
  keys = jax.random.split(key, new.num_clients)

  def client(client_key, x, y, count, x_test, y_test, test_count):
    tuned = algorithm.sgd(algorithm.loss, flat, x, y, count, client_key, hparams, epochs)[0]
    accuracy, hits = train.tested(algorithm.logits(tuned, x_test), y_test, test_count)
    return accuracy, hits, jnp.zeros(()) if measure is None else measure(tuned)

  accuracies, hits, measured = new.map_clients(client, keys, jnp.arange(new.num_clients),
                                               algorithm.client_group, test=True)
  return {**evaluation.accuracy_metrics(accuracies, hits, new.test_counts),
          "measure": measured}


def training_rows_of(rows) -> list[dict]:
  """The rows of training (those with train_loss) among a recipe's rows."""
  return [r for r in rows if "train_loss" in r]


def summary(rows, by: str, columns: tuple[str, ...], config: Config) -> list[dict]:
  """Per algorithm of COMPARED and value of column `by` (in the rows' order): the mean over
  the seeds whose run did not diverge of each of `columns` (`seeds` of them; NaN: none) and
  its std over them (COLUMN_std_over_seeds), beside the algorithm's final test accuracy on
  its training clients (mean over those seeds); `diverged`: how many seeds were left out
  because their run diverged."""
  table = []
  for name in compared.COMPARED:
    diverged = {r["seed"] for r in rows if r["algorithm"] == name and r.get("diverged_round")}
    kept = [r for r in rows if r["algorithm"] == name and r["seed"] not in diverged]
    last = compared.final_round(name, config)
    test = [r["test_accuracy"] for r in kept
            if r["round"] == last and r.get("test_accuracy") is not None]
    for value in dict.fromkeys(r[by] for r in kept if r.get(by) is not None):
      entry = {"algorithm": name, by: value}
      for column in columns:
        values = [r[column] for r in kept if r.get(by) == value and r.get(column) is not None]
        entry[column] = float(np.mean(values)) if values else np.nan
        entry[f"{column}_std_over_seeds"] = float(np.std(values)) if values else np.nan
        entry["seeds"] = len(values)
      entry.update(diverged=len(diverged),
                   final_test_accuracy=float(np.mean(test)) if test else np.nan)
      table.append(entry)
  return table


def training_panel(ax, rows) -> None:
  """Test accuracy on the training clients vs local updates, FedAvg and D-SGD."""
  training = training_rows_of(rows)
  for name in compared.COMPARED:
    plotting.line(ax, training, "local_updates", "test_accuracy", labels.label(name),
                  along="round", algorithm=name)
  ax.set(xlabel="local updates per client (rounds x tau)",
         ylabel="test accuracy (training clients)", title="training")


def setting_text(config: Config) -> str:
  """A figure title's lines on the model and the training, and on the new data."""
  new = ("mirrored, inverted and relabelled " + config.dataset
         if config.new_dataset == TRANSFORMED else config.new_dataset)
  model = config.model if config.model != "auto" else (
      datasets.lookup(config.dataset).model or "the dataset's model")
  return (f"{model} on {config.dataset}: n={config.num_clients}, "
          f"{config.classes_per_client} classes/client, r={config.participation}; FedAvg "
          f"tau={config.local_steps} x {config.rounds} rounds, D-SGD 1 x "
          f"{config.rounds * config.local_steps}\nnew clients: {new}, "
          f"{config.transfer_clients} per seed; mean and std over seeds")
