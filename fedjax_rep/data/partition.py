"""Dataset-independent partitioners: label arrays and a seed in, per-client index lists out.

Every partitioner takes train_labels [N] and test_labels [T] (1-D integer arrays) and returns
(train_parts, test_parts): two lists of num_clients int64 index arrays into train_labels and
test_labels. No index is in two clients' parts (within train, and within test), each part is
in a shuffled order, and everything is a deterministic function of the seed. The classes are
the distinct values of train_labels; test samples of a class absent from train are left out
by 'classes' and 'dirichlet'.
"""

import numpy as np

PARTITIONS = {
    "classes": "FedRep's shards: each client draws classes_per_client class labels from a "
               "shuffled pool holding every class equally often and takes one shard of each "
               "(sizes in proportion to client weights ~ LogNormal(0, size_sigma) if > 0)",
    "dirichlet": "each class's samples split over clients by proportions ~ Dir(dirichlet_alpha)",
    "iid": "a uniformly random split into near-equal parts",
}

_DIRICHLET_TRIES = 100


def _labels(labels, name: str) -> np.ndarray:
  """labels as a numpy array, checked to be 1-D integers."""
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"{name} must be a 1-D integer array, got shape {labels.shape} and "
                     f"dtype {labels.dtype}")
  return labels


def _check(train_labels, test_labels, num_clients: int):
  """(train_labels, test_labels) checked, with num_clients in [1, N]."""
  train_labels = _labels(train_labels, "train_labels")
  test_labels = _labels(test_labels, "test_labels")
  if not isinstance(num_clients, (int, np.integer)) or not 1 <= num_clients <= len(train_labels):
    raise ValueError(f"num_clients must be in [1, {len(train_labels)}] (the number of train "
                     f"samples), got {num_clients}")
  return train_labels, test_labels


def _gather(chunks: list[list[np.ndarray]], rng: np.random.Generator) -> list[np.ndarray]:
  """Per-client int64 index arrays: client i's chunks[i] concatenated and shuffled."""
  return [rng.permutation(np.concatenate(c).astype(np.int64)) for c in chunks]


def _apportion(n: int, weights: np.ndarray) -> np.ndarray:
  """Integer sizes [h] summing to n, proportional to weights [h] (largest remainders, ties
  to the earlier entry); equal weights give np.array_split's sizes."""
  quotas = n * weights / weights.sum()
  sizes = np.floor(quotas).astype(np.int64)
  sizes[np.argsort(sizes - quotas, kind="stable")[:n - sizes.sum()]] += 1
  return sizes


def _shards(idx: np.ndarray, k: int, rng: np.random.Generator, weights, least: int):
  """k shards (index arrays) of one class's sample indices idx. weights None: FedRep's
  shards, k equal parts of idx in its order, the len(idx) % k left over going one each to
  the first shards. weights [k] (the holders'): parts of a random permutation of idx of
  sizes least + a share of the rest in proportion to the weights (`_apportion`)."""
  if k == 0:
    return []
  if weights is None:
    q, r = divmod(len(idx), k)
    equal = idx[:k * q].reshape(k, q)
    return [np.append(equal[j], idx[k * q + j]) if j < r else equal[j] for j in range(k)]
  sizes = least + _apportion(len(idx) - least * k, weights)
  return np.split(rng.permutation(idx), np.cumsum(sizes)[:-1])


def classes(train_labels, test_labels, num_clients: int, classes_per_client: int, seed: int,
            size_sigma: float = 0.0):
  """FedRep's shard partition (`noniid` of FedRep's and FLUTE's code): (train_parts,
  test_parts), each a list of num_clients arrays.

  With S = classes_per_client, the n x S label slots are filled with each of the C classes
  n S / C times, shuffled and read row by row: client i's row is S labels drawn without
  replacement from that pool, so class sets are random and a client may draw a class twice
  (then it has fewer than S distinct classes). Each class's train samples, in their order,
  are cut into as many equal shards as the class has slots (the remainder going one sample
  each to the first shards), and client i takes, for each label of its row, one unused shard
  of that class at random. The test samples are cut and dealt the same way over the same
  rows, so a client's test labels come from its row. Where C does not divide n S (FedRep's
  code needs it to), the first n S mod C classes of a random order get one slot more. With
  size_sigma > 0 each client draws a weight ~ LogNormal(0, size_sigma) and a class's
  shuffled samples are cut among its slots as 1 each (train; 0 for test) plus the rest in
  proportion to the slot holders' weights, so client sizes are log-normal as in FedRep's
  FEMNIST.
  """
  train_labels, test_labels = _check(train_labels, test_labels, num_clients)
  names, sizes = np.unique(train_labels, return_counts=True)
  if (not isinstance(classes_per_client, (int, np.integer))
      or not 1 <= classes_per_client <= len(names)):
    raise ValueError(f"classes_per_client must be in [1, {len(names)}] (the number of "
                     f"classes in train_labels), got {classes_per_client}")
  if not size_sigma >= 0 or not np.isfinite(size_sigma):
    raise ValueError(f"size_sigma must be a finite number >= 0, got {size_sigma}")
  rng = np.random.default_rng(seed)
  slots = num_clients * classes_per_client
  shards = np.full(len(names), slots // len(names))
  shards[rng.permutation(len(names))[:slots % len(names)]] += 1
  for name, size, k in zip(names, sizes, shards):
    if size < k:
      raise ValueError(f"class {name} has {size} train samples but {k} shards (client slots: "
                       f"num_clients * classes_per_client / classes); use fewer clients or "
                       f"fewer classes_per_client")
  rows = rng.permutation(np.repeat(np.arange(len(names)), shards)).reshape(
      num_clients, classes_per_client)
  weights = rng.lognormal(0.0, size_sigma, num_clients) if size_sigma > 0 else None
  holders = [np.nonzero(rows == c)[0] for c in range(len(names))]  # row-major slot order
  parts = []
  for labels, least in ((train_labels, 1), (test_labels, 0)):
    pools = [_shards(np.flatnonzero(labels == name), k, rng,
                     None if weights is None else weights[h], least)
             for name, k, h in zip(names, shards, holders)]
    chunks = [[] for _ in range(num_clients)]
    for client, row in enumerate(rows):
      for c in row:  # weighted shards are cut in slot order; FedRep's are drawn at random
        chunks[client].append(pools[c].pop(0 if weights is not None
                                           else int(rng.integers(len(pools[c])))))
    parts.append(_gather(chunks, rng))
  return tuple(parts)


def dirichlet(train_labels, test_labels, num_clients: int, alpha: float, seed: int,
              min_samples: int = 2):
  """Label-skewed partition: (train_parts, test_parts), each a list of num_clients arrays.

  For each class, proportions p [num_clients] ~ Dir(alpha) cut the class's shuffled train
  samples at the cumulative sums of p; its test samples are cut at the same fractions of the
  class that the train cut realised (cumulative train counts * T_c // N_c), so a client's test
  labels follow its train labels and only come from classes it trains on. The proportions
  are redrawn, at most 100 times, until every client has at least min_samples train samples.
  """
  train_labels, test_labels = _check(train_labels, test_labels, num_clients)
  if not alpha > 0 or not np.isfinite(alpha):
    raise ValueError(f"dirichlet_alpha must be a finite number > 0, got {alpha}")
  if not 0 <= min_samples * num_clients <= len(train_labels):
    raise ValueError(f"min_samples must be in [0, {len(train_labels) // num_clients}] for "
                     f"{num_clients} clients sharing {len(train_labels)} train samples, got "
                     f"{min_samples}; use fewer clients")
  rng = np.random.default_rng(seed)
  names = np.unique(train_labels)
  train_idx = [rng.permutation(np.flatnonzero(train_labels == c)) for c in names]
  test_idx = [rng.permutation(np.flatnonzero(test_labels == c)) for c in names]
  for _ in range(_DIRICHLET_TRIES):
    p = rng.dirichlet(np.full(num_clients, float(alpha)), size=len(names))  # [C, num_clients]
    cuts = [(np.cumsum(pc)[:-1] * len(idx)).astype(np.int64) for pc, idx in zip(p, train_idx)]
    sizes = sum(np.diff(cut, prepend=0, append=len(idx)) for cut, idx in zip(cuts, train_idx))
    if sizes.min() >= min_samples:
      break
  else:
    raise ValueError(f"no Dirichlet draw in {_DIRICHLET_TRIES} tries gave each of the "
                     f"{num_clients} clients at least min_samples={min_samples} train samples "
                     f"(dirichlet_alpha={alpha}); use fewer clients or a larger alpha")
  train = [[] for _ in range(num_clients)]
  test = [[] for _ in range(num_clients)]
  for cut, tr, te in zip(cuts, train_idx, test_idx):
    test_cut = cut * len(te) // len(tr)
    for client, (a, b) in enumerate(zip(np.split(tr, cut), np.split(te, test_cut))):
      train[client].append(a)
      test[client].append(b)
  return _gather(train, rng), _gather(test, rng)


def iid(train_labels, test_labels, num_clients: int, seed: int):
  """Uniform partition: (train_parts, test_parts), a random permutation of the N train (and
  T test) samples split into num_clients parts whose sizes differ by at most one."""
  train_labels, test_labels = _check(train_labels, test_labels, num_clients)
  rng = np.random.default_rng(seed)
  train = np.array_split(rng.permutation(len(train_labels)).astype(np.int64), num_clients)
  test = np.array_split(rng.permutation(len(test_labels)).astype(np.int64), num_clients)
  return train, test


def partition(name: str, train_labels, test_labels, *, num_clients: int, seed: int,
              classes_per_client: int = 2, dirichlet_alpha: float = 0.5,
              size_sigma: float = 0.0):
  """Splits a dataset's train and test samples over clients with partitioner `name`.

  Arguments are checked before any work is done.

  Args:
    name: a key of PARTITIONS ('classes', 'dirichlet' or 'iid').
    train_labels: training labels [N] (1-D integers).
    test_labels: test labels [T] (1-D integers).
    num_clients: the number of clients.
    seed: the seed of the split (everything is a deterministic function of it).
    classes_per_client: classes of each client ('classes' only).
    dirichlet_alpha: the concentration of Dir(dirichlet_alpha) ('dirichlet' only).
    size_sigma: client weights ~ LogNormal(0, size_sigma) size the shards when > 0
      ('classes' only).

  Returns:
    (train_parts, test_parts): each a list of num_clients int64 index arrays, into
    train_labels and test_labels.
  """
  if name not in PARTITIONS:
    raise ValueError(f"partition must be one of {sorted(PARTITIONS)}, got {name!r}")
  if name == "classes":
    return classes(train_labels, test_labels, num_clients, classes_per_client, seed, size_sigma)
  if name == "dirichlet":
    return dirichlet(train_labels, test_labels, num_clients, dirichlet_alpha, seed)
  return iid(train_labels, test_labels, num_clients, seed)
