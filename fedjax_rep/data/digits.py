"""scikit-learn's bundled digits: 1,797 8x8 grey images of 10 classes, available offline."""

import numpy as np

from fedjax_rep.data import partition as partitioning
from fedjax_rep.data.federated import ClientDatasets, client_datasets

NUM_CLASSES = 10


def load(seed: int = 0, test_fraction: float = 0.25):
  """(x_train [N, 8, 8, 1], y_train [N], x_test [T, 8, 8, 1], y_test [T]): pixels float32 in
  [0, 1], labels int32. Each class's samples are shuffled with the seed and round(test_fraction
  * its size) of them go to test, so the split is stratified and deterministic."""
  if not 0 < test_fraction < 1:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
  from sklearn.datasets import load_digits  # Imported here: scikit-learn is only needed here.
  data = load_digits()
  x = (data.images / 16.0).astype(np.float32)[..., None]
  y = data.target.astype(np.int32)
  rng = np.random.default_rng(seed)
  train, test = [], []
  for c in range(NUM_CLASSES):
    idx = rng.permutation(np.flatnonzero(y == c))
    cut = round(test_fraction * len(idx))
    test.append(idx[:cut])
    train.append(idx[cut:])
  train, test = np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
  return x[train], y[train], x[test], y[test]


def federated(num_clients: int, partition: str = "classes", classes_per_client: int = 2,
              dirichlet_alpha: float = 0.5, seed: int = 0,
              test_fraction: float = 0.25) -> ClientDatasets:
  """Digits split over num_clients clients by partitioner `partition` (see
  partition.PARTITIONS), padded to x [num_clients, m, 8, 8, 1] and x_test [num_clients, t,
  8, 8, 1] (m, t: the largest client; `federated.stack` pads several to one shape); the
  seed drives both the train/test split and the partition."""
  x, y, x_test, y_test = load(seed, test_fraction)
  parts, test_parts = partitioning.partition(
      partition, y, y_test, num_clients=num_clients, seed=seed,
      classes_per_client=classes_per_client, dirichlet_alpha=dirichlet_alpha)
  return client_datasets(x, y, parts, x_test, y_test, test_parts, num_classes=NUM_CLASSES)
