"""CIFAR-10, CIFAR-100 and EMNIST from tensorflow-datasets' array_record files.

`tfds build NAME --file_format=array_record` (needs TensorFlow and internet, see `how_to`)
prepares a dataset once under DATA_DIR/NAME[/CONFIG]/VERSION; `load` then reads it through
`tfds.data_source`, which needs neither. DATA_DIR is the `data_dir` argument, else env
TFDS_DATA_DIR, else ~/tensorflow_datasets (tfds's own default). Names: `cifar10`,
`cifar100`, `emnist` (= `emnist/balanced`, the config srpfl-neural reads) or `emnist/CONFIG`
for any of tfds's EMNIST configs.
"""

import glob
import logging
import os
import re

import numpy as np

from fedjax_rep.data.missing import DataMissing

DATASETS = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "emnist": "EMNIST"}
EMNIST_DEFAULT = "balanced"
_BATCH = 4096  # records per `__getitems__` call


def _parse(name: str) -> tuple[str, str]:
  """(builder, config) of a dataset name; config is '' for the CIFARs."""
  builder, _, config = name.partition("/")
  if builder not in DATASETS or (config and builder != "emnist"):
    raise ValueError(f"dataset must be one of {sorted(DATASETS)} or emnist/CONFIG, got {name!r}")
  return builder, config or (EMNIST_DEFAULT if builder == "emnist" else "")


def _spec(name: str) -> str:
  """tfds's name of the dataset: 'cifar10', 'emnist/balanced', ..."""
  return "/".join(filter(None, _parse(name)))


def root(data_dir: str | None = None) -> str:
  """The tfds data directory: data_dir, else env TFDS_DATA_DIR, else ~/tensorflow_datasets."""
  return os.path.expanduser(data_dir or os.environ.get("TFDS_DATA_DIR")
                            or "~/tensorflow_datasets")


def _version(v: str) -> tuple[int, ...]:
  """'3.0.2' -> (3, 0, 2)."""
  return tuple(int(part) for part in v.split("."))


def _prepared(name: str, data_dir: str | None) -> str | None:
  """The newest DATA_DIR/NAME[/CONFIG]/VERSION directory that holds dataset_info.json and
  array_record shards of the train and test splits, or None (file system checks only)."""
  base = os.path.join(root(data_dir), _spec(name))
  try:
    versions = [v for v in os.listdir(base) if re.fullmatch(r"\d+\.\d+\.\d+", v)]
  except OSError:
    return None
  for version in sorted(versions, key=_version, reverse=True):
    path = os.path.join(base, version)
    if os.path.isfile(os.path.join(path, "dataset_info.json")) and all(
        glob.glob(os.path.join(glob.escape(path), f"*-{split}.array_record-*"))
        for split in ("train", "test")):
      return path
  return None


def status(name: str, data_dir: str | None = None) -> tuple[bool, str]:
  """(present, location): the prepared version directory, or the data directory it would go in."""
  path = _prepared(name, data_dir)
  return path is not None, path or root(data_dir)


def how_to(name: str, data_dir: str | None = None) -> str:
  """The one-line command that prepares the dataset in the data directory."""
  return (f"pip install 'fedjax_rep[data]' && tfds build {_spec(name)} "
          f"--file_format=array_record --data_dir={root(data_dir)}  (needs internet; set "
          f"TFDS_DATA_DIR to keep datasets elsewhere)")


def _arrays(source, mock: bool) -> tuple[np.ndarray, np.ndarray]:
  """(images [N, H, W, C] float32 in [0, 1], labels [N] int32) of a tfds data source."""
  images = np.empty((len(source), *source.dataset_info.features["image"].shape), np.uint8)
  labels = np.empty(len(source), np.int32)
  for start in range(0, len(source), _BATCH):
    keys = list(range(start, min(start + _BATCH, len(source))))
    # tfds's mock data source has no working __getitems__ (tfds 4.9.10): one record a call.
    records = [source[k] for k in keys] if mock else source.__getitems__(keys)
    images[keys] = [r["image"] for r in records]
    labels[keys] = [r["label"] for r in records]
  pixels = images.astype(np.float32)
  pixels /= 255.0
  return pixels, labels


def require(name: str, data_dir: str | None = None) -> str:
  """The prepared version directory of dataset `name`, or DataMissing naming the command
  that prepares it (a file-system check: fast, before any work)."""
  path = _prepared(name, data_dir)
  if path is None:
    raise DataMissing(f"{DATASETS[_parse(name)[0]]} is not in {root(data_dir)} as "
                      f"array_record files: run  {how_to(name, data_dir)}")
  return path


def _read(name: str, data_dir: str | None):
  """[(x_train, y_train), (x_test, y_test)] from the prepared files (DataMissing if none)."""
  path = require(name, data_dir)
  import tensorflow_datasets as tfds  # Imported here: slow, and only needed to read.
  sources = tfds.data_source(f"{_spec(name)}:{os.path.basename(path)}", split=["train", "test"],
                             data_dir=root(data_dir), download=False)
  return [_arrays(source, mock=False) for source in sources]


def _not_mock_info_warning(record: logging.LogRecord) -> bool:
  """A filter of the 'absl' logger: drops tfds's warning that a folder "has no
  dataset_info.json", logged on every mock load (its mock metadata folders hold none, and
  the mock data need none)."""
  return "has no dataset_info.json" not in record.getMessage()


def _mock(name: str, examples: int):
  """[(x_train, y_train), (x_test, y_test)] of `examples` random examples per split."""
  import tensorflow_datasets as tfds
  absl = logging.getLogger("absl")
  absl.addFilter(_not_mock_info_warning)
  try:
    with tfds.testing.mock_data(num_examples=examples):
      return [_arrays(source, mock=True)
              for source in tfds.data_source(_spec(name), split=["train", "test"])]
  finally:
    absl.removeFilter(_not_mock_info_warning)


def load(name: str, data_dir: str | None = None, mock_examples: int | None = None,
         classes: int | None = None):
  """(x_train [N, H, W, C], y_train [N], x_test [T, H, W, C], y_test [T]) of dataset `name`:
  pixels float32 in [0, 1], labels int32 (tfds's: CIFAR-10 0..9, CIFAR-100 0..99 fine
  labels, EMNIST balanced 0..46, digits first). EMNIST images are transposed to stand
  upright (tfds keeps NIST's transposed storage). With mock_examples=k, k random examples per
  split from `tfds.testing.mock_data` instead of the files; with classes=c, only the samples
  labelled 0..c-1. Raises DataMissing, naming the command that prepares the data, when the files are
  not there."""
  (x, y), (x_test, y_test) = (_read(name, data_dir) if mock_examples is None
                              else _mock(name, mock_examples))
  if _parse(name)[0] == "emnist":
    x, x_test = x.transpose(0, 2, 1, 3), x_test.transpose(0, 2, 1, 3)
  if classes is not None:
    x, y, x_test, y_test = x[y < classes], y[y < classes], x_test[y_test < classes], y_test[
        y_test < classes]
  return x, y, x_test, y_test
