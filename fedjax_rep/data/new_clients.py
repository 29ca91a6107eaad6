"""Clients held out of training (`split`): new clients, who never train and are tested after
adapting to their own data (`nn.new_clients`).

Of a run's n clients, k (`count`: a fraction of n or a number) are new: the positions that
numpy.random.default_rng((seed, STREAM)).choice(n, k, replace=False) draws, so the choice
depends on the run's seed only. The others train, in their order, and the new clients keep
theirs: both are stores of the same kind as the run's, and the training clients' store holds
none of the new clients' samples.
"""

import numpy as np

from fedjax_rep.data import federated
from fedjax_rep.data import flat

STREAM = 0x6E6577  # the rng's second entropy word ("new"): the draw is its own stream


def count(value: float, num_clients: int) -> int:
  """k, the new clients among `num_clients`: round(value * n) for a fraction value in [0, 1),
  value itself for a whole number >= 1. ValueError where that leaves no client to train or
  value is neither."""
  if value < 1:
    k = round(value * num_clients)
  elif float(value).is_integer():
    k = int(value)
  else:
    raise ValueError(f"new_clients={value!r} must be a fraction in [0, 1) or a whole number "
                     f"of clients")
  if k >= num_clients:
    raise ValueError(f"new_clients={value!r} holds out {k} of the {num_clients} clients, "
                     f"leaving none to train: hold out fewer")
  return k


def chosen(seed: int, num_clients: int, k: int) -> np.ndarray:
  """The positions [k] (ascending) of the new clients of the run with seed `seed`."""
  picked = np.random.default_rng((seed, STREAM)).choice(num_clients, k, replace=False)
  return np.sort(picked)


def split(data, k: int, seed: int) -> tuple:
  """One run's clients split into those that train and k new ones (`chosen` by `seed`).

  Args:
    data: `federated.ClientDatasets` or `flat.FlatClients` of one run's n clients, without a
      validation split and not laid out for devices.
    k: how many clients are new (`count`), in [0, n).
    seed: the run's seed, which chooses them.

  Returns:
    (training clients, new clients): two stores of data's kind, of the n - k others in
    their order and of the k new ones in theirs, each holding only its own clients' samples.
  """
  if data.has_validation:
    raise ValueError("new_clients.split takes data without a validation split: hold the "
                     "new clients out first, then split the training clients' samples")
  new = chosen(seed, data.num_clients, k)
  train = np.setdiff1d(np.arange(data.num_clients), new)
  return _clients(data, train), _clients(data, new)


def _clients(data, clients: np.ndarray):
  """The store of `data`'s clients `clients` [c] (in that order)."""
  if isinstance(data, federated.ClientDatasets):
    pick = lambda a: np.asarray(a)[clients]
    return data.replace(x=pick(data.x), y=pick(data.y), counts=pick(data.counts),
                        x_test=pick(data.x_test), y_test=pick(data.y_test),
                        test_counts=pick(data.test_counts))
  if data.blocks != 1:
    raise ValueError("new_clients.split takes a store not yet laid out for devices")
  rows = lambda offsets, counts: [np.arange(o, o + c) for o, c in
                                  zip(np.asarray(offsets)[clients], np.asarray(counts)[clients])]
  x, y = np.asarray(data.x), np.asarray(data.y)
  return flat.flat_clients(x, y, rows(data.offsets, data.counts), x, y,
                           rows(data.test_offsets, data.test_counts), data.num_classes)

