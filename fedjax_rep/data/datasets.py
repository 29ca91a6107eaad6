"""The datasets that the dataset-taking recipes accept by name (`--set dataset=NAME`:
fedrep-table1-cifar10/cifar100, flute-table1, srpfl-neural, digits-personalized): the
package's own and any a user registers (`register`, `fr.register_dataset`, also from a
`--plugin` file).

An entry says what a recipe needs to know of a dataset: how to load its pooled arrays
(x [N, ...], y [N], x_test [T, ...], y_test [T], which the recipe splits over its clients
with a `data.partition` partition), its number of classes, its model (a name of
`nn.models.MODELS`, or None: the one its input shape picks, `nn.models.model_for`) and a
one-line summary for `fedjax-rep list`; and optionally whether the arrays depend on the
seed, random stand-ins in the same format (source=mock) and where its files are
(`fedjax-rep data`, and the check before a run).
"""

import dataclasses
import re
from collections.abc import Callable

import numpy as np

from fedjax_rep.data import digits, leaf, tfds_data
from fedjax_rep.data.missing import DataMissing

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # what --set dataset=NAME can spell


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A registered dataset.

  name: what `--set dataset=` takes; summary: its line in `fedjax-rep list`; load(seed) ->
  (x [N, ...], y [N], x_test [T, ...], y_test [T]) (numpy; integer labels in [0,
  num_classes)); num_classes: C; model: a `nn.models.MODELS` name, or None for the one its
  input shape picks; seeded: whether load's arrays depend on its seed (a train/test split
  drawn from it, as digits'): the recipes that draw each seed's data load it per seed, the
  others once (`by_seed`); mock(examples, seed): random arrays in load's format, `examples`
  per split, that source=mock trains on (None: the real arrays, whatever the source);
  status() -> (present, location, how to get it, '' when present) of its files (None: none
  to fetch).
  """
  name: str
  summary: str
  load: Callable
  num_classes: int
  model: str | None = None
  seeded: bool = False
  mock: Callable | None = None
  status: Callable | None = None


DATASETS: dict[str, Dataset] = {}  # every registered dataset by name, in registration order


def register(name: str, summary: str, load: Callable, num_classes: int, *,
             model: str | None = None, seeded: bool = False, mock: Callable | None = None,
             status: Callable | None = None) -> Dataset:
  """Registers a dataset that the dataset-taking recipes then accept as `dataset=name`.

  Args:
    name: letters, digits, '_', '.', '-' (starting with a letter or digit).
    summary: one line for `fedjax-rep list`.
    load: load(seed) -> (x [N, ...], y [N], x_test [T, ...], y_test [T]): the pooled
      training and test arrays (numpy; labels integers in [0, num_classes)).
    num_classes: the number of classes C >= 2.
    model: the model's name (`fr.MODELS`); None: the one its input shape picks (images
      [32, 32, 3]: cifar10-cnn; [28, 28, 1] and other [H, W, C]: mlp; [8, 8, 1]:
      digits-mlp; vectors [D]: synthetic-mlp).
    seeded: whether load's arrays depend on its seed (e.g. a split drawn from it).
    mock: mock(examples, seed) -> random arrays in load's format, for source=mock.
    status: status() -> (present, location, how to get it) of the dataset's files.

  Returns:
    Its `Dataset`.

  Raises:
    ValueError, naming the argument: a name that is taken (unless by the same function
    defined again outside the package: a plugin file or a notebook cell run again, which
    replaces it) or misspelt, a summary that is not one line of text, a load, mock or
    status that is not callable, num_classes not an integer >= 2, a model that is not a
    name, seeded not a bool.
  """
  if not isinstance(name, str) or not NAME.fullmatch(name):
    raise ValueError(f"register_dataset: name must be letters, digits, '_', '.' or '-' "
                     f"(starting with a letter or digit), got {name!r}")
  if not isinstance(summary, str) or not summary.strip() or "\n" in summary:
    raise ValueError(f"register_dataset({name!r}): summary must be one line of text (its "
                     f"line in fedjax-rep list), got {summary!r}")
  for what, function in (("load", load), ("mock", mock), ("status", status)):
    if not callable(function) and not (what != "load" and function is None):
      raise ValueError(f"register_dataset({name!r}): {what} must be a function"
                       + (" (or None)" if what != "load" else "")
                       + f", got {type(function).__name__}")
  if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or (
      num_classes < 2):
    raise ValueError(f"register_dataset({name!r}): num_classes must be an integer >= 2 (the "
                     f"labels' range), got {num_classes!r}")
  if model is not None and (not isinstance(model, str) or not model):
    raise ValueError(f"register_dataset({name!r}): model must be a model's name (fr.MODELS) "
                     f"or None (chosen by the input shape), got {model!r}")
  if not isinstance(seeded, bool):
    raise ValueError(f"register_dataset({name!r}): seeded must be True or False, got "
                     f"{seeded!r}")
  previous = DATASETS.get(name)
  if previous is not None and not _same_user_function(previous.load, load):
    raise ValueError(f"dataset {name!r} is registered already (by {previous.load.__module__}); "
                     f"register yours under another name")
  DATASETS[name] = Dataset(name, summary, load, int(num_classes), model, seeded, mock, status)
  return DATASETS[name]


def _same_user_function(previous: Callable, load: Callable) -> bool:
  """Whether `load` is `previous` defined again by the same user module (not the package's)."""
  where = lambda f: (getattr(f, "__module__", None), getattr(f, "__qualname__", None))
  return where(previous) == where(load) and not str(where(load)[0]).startswith("fedjax_rep.")


def names() -> tuple[str, ...]:
  """The names of the datasets registered now (the package's, then the user's)."""
  return tuple(DATASETS)


def lookup(name: str) -> Dataset:
  """The dataset registered as `name`; ValueError naming the registered ones otherwise."""
  if name not in DATASETS:
    raise ValueError(f"unknown dataset {name!r}; registered datasets: {', '.join(DATASETS)} "
                     f"(register yours with fr.register_dataset)")
  return DATASETS[name]


def require(name: str) -> None:
  """DataMissing (one line naming the command that gets them) where dataset `name`'s files
  are not there (`Dataset.status`; a file-system check, fast, before any work)."""
  status = lookup(name).status
  if status is not None:
    present, location, how = status()
    if not present:
      raise DataMissing(f"{name} is not in {location}: run  {how}")


def arrays(name: str, seed: int, mock_examples: int | None = None) -> tuple:
  """(x [N, ...], y [N], x_test [T, ...], y_test [T]) of dataset `name`: its load(seed), or
  with mock_examples=k its mock(k, seed) where it has one. Raises ValueError naming the
  dataset where they do not fit together: not four arrays, x and y (x_test and y_test) of
  different lengths, labels that are not 1-D integers in [0, num_classes), x_test's example
  shape not x's."""
  entry = lookup(name)
  loaded = (entry.mock(mock_examples, seed) if mock_examples is not None and entry.mock
            else entry.load(seed))
  if not isinstance(loaded, (tuple, list)) or len(loaded) != 4:
    raise ValueError(f"dataset {name!r}: load must return (x, y, x_test, y_test), got "
                     f"{type(loaded).__name__}")
  x, y, x_test, y_test = (np.asarray(a) for a in loaded)
  for inputs, labels, split in ((x, y, "x, y"), (x_test, y_test, "x_test, y_test")):
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
      raise ValueError(f"dataset {name!r}: the labels of ({split}) must be a 1-D integer "
                       f"array, got shape {labels.shape} and dtype {labels.dtype}")
    if inputs.ndim < 2 or len(inputs) != len(labels):
      raise ValueError(f"dataset {name!r}: ({split}) must be inputs [N, ...] and labels [N], "
                       f"got shapes {inputs.shape} and {labels.shape}")
    if len(labels) and (labels.min() < 0 or labels.max() >= entry.num_classes):
      raise ValueError(f"dataset {name!r}: the labels of ({split}) span [{labels.min()}, "
                       f"{labels.max()}], outside [0, {entry.num_classes}) (its num_classes)")
  if x.shape[1:] != x_test.shape[1:]:
    raise ValueError(f"dataset {name!r}: x_test's examples have shape {x_test.shape[1:]}, "
                     f"x's {x.shape[1:]}: give both splits the same example shape")
  return x, y, x_test, y_test


def by_seed(name: str, seed: int) -> Callable[[int], tuple]:
  """A function s -> the arrays of dataset `name` for seed s: `arrays(name, s)` of a seeded
  dataset (each seed its own split), else the arrays of `seed`, loaded once."""
  if lookup(name).seeded:
    return lambda s: arrays(name, s)
  loaded = arrays(name, seed)
  return lambda s: loaded


def subsample(pooled: tuple, samples: int, seed: int) -> tuple:
  """Pooled arrays (x [N, ...], y [N], x_test [T, ...], y_test [T]) cut at random to
  `samples` training samples (all where there are fewer) and the test samples by the same
  fraction (at least one), each in pooled order; the draw is numpy's default_rng(seed)."""
  x, y, x_test, y_test = pooled
  if samples >= len(y):
    return x, y, x_test, y_test
  rng = np.random.default_rng(seed)
  train = np.sort(rng.permutation(len(y))[:samples])
  test = np.sort(rng.permutation(len(y_test))[:max(1, len(y_test) * samples // len(y))])
  return x[train], y[train], x_test[test], y_test[test]


def _files(module, name: str) -> Callable[[], tuple[bool, str, str]]:
  """The `Dataset.status` of dataset `name` of loader module `module` (`tfds_data`, `leaf`:
  their status and how_to)."""

  def status():
    present, location = module.status(name)
    return present, location, "" if present else module.how_to(name)

  return status


def _tfds(name: str, summary: str, num_classes: int, model: str) -> None:
  """Registers tfds dataset `name` restricted to its first num_classes labels, with tfds's
  mock data as its mock."""
  register(name, summary, lambda seed: tfds_data.load(name, classes=num_classes), num_classes,
           model=model, mock=lambda examples, seed: tfds_data.load(
               name, mock_examples=examples, classes=num_classes),
           status=_files(tfds_data, name))


register("digits", "scikit-learn's digits: 1,797 8x8 grey images, 10 classes, the test quarter "
         "of each class drawn by the seed (offline)", digits.load,
         digits.NUM_CLASSES, model="digits-mlp", seeded=True,
         status=lambda: (True, "bundled with scikit-learn (data/digits.py)", ""))
_tfds("cifar10", "CIFAR-10: 50,000 + 10,000 32x32 colour images, 10 classes (tfds files)", 10,
      "cifar10-cnn")
_tfds("cifar100", "CIFAR-100: 50,000 + 10,000 32x32 colour images, 100 fine classes (tfds "
      "files)", 100, "cifar100-cnn")
_tfds("emnist", "EMNIST balanced's 10 digits: 28x28 grey images, upright (tfds files)", 10,
      "mlp")
register("femnist", "FEMNIST's letters A-J: every LEAF writer's 28x28 images pooled (LEAF "
         "files)", lambda seed: leaf.femnist_pooled(leaf.FEMNIST_LETTERS),
         len(leaf.FEMNIST_LETTERS), model="mlp", status=_files(leaf, "femnist"))
