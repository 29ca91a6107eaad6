"""A per-client validation split carved from each client's training samples (`split`).

Client i of a run with seed s and c training samples moves k = min(floor(fraction * c),
c - 1) of them (none where c is 0) to its validation split: the positions `held_out`
draws with numpy.random.default_rng((s, i)), so the split depends on the seed and the
client only. The training samples left keep their relative order, as do the validation
samples. A client with k = 0 has no validation samples and is left out of the validation
metrics (`nn.evaluation.evaluate`'s val_*), as clients without test samples are left out of
the test metrics. The test split is not touched.
"""

import math
import numbers
import warnings

import jax
import numpy as np

from fedjax_rep.core import checks
from fedjax_rep.data import federated
from fedjax_rep.data import flat


def held_out_count(count: int, fraction: float) -> int:
  """k: how many of a client's `count` training samples go to validation: min(floor(fraction
  * count), count - 1), 0 where count is 0 (a client keeps a training sample)."""
  return max(0, min(math.floor(fraction * count), count - 1))


def held_out(seed: int, client: int, count: int, fraction: float) -> np.ndarray:
  """The positions [k] (ascending, in [0, count)) of the training samples that client
  `client` of the run with seed `seed` moves to validation: k = `held_out_count`, drawn by
  numpy.random.default_rng((seed, client)).choice(count, k, replace=False)."""
  k = held_out_count(count, fraction)
  if k == 0:
    return np.zeros(0, np.int64)
  return np.sort(np.random.default_rng((seed, client)).choice(count, k, replace=False))


def split(data, fraction: float, seeds):
  """`data` with a validation split carved from each client's training samples.

  Client i of the run with seed s moves k = min(floor(fraction * c), c - 1) of its c
  training samples (`held_out`) to validation (module docstring). Works on the host with
  numpy (the data must be concrete, not traced).

  Args:
    data: `federated.ClientDatasets` or `flat.FlatClients` without a validation split, of
      one run (counts [n]) or stacked over s runs (counts [s, n]; `federated.stack`,
      `flat.stack`).
    fraction: the share of each client's training samples to hold out, in [0, 1).
    seeds: an int >= 0 (one run), or a sequence of s ints >= 0 (stacked: run r's is
      seeds[r]), e.g. the runs' seeds.

  Returns:
    The same kind of store with the validation split (`data` itself where fraction is 0):
    ClientDatasets with x, y of the same shapes (client i's first counts[i] rows its
    remaining training samples, zero after), counts reduced by k, and x_val [n, v, ...],
    y_val [n, v], val_counts [n] (v: the largest k, at least 1; stacked: of every run);
    FlatClients with a new store in the same blocks holding, block by block, the clients'
    training rows, then test rows, then validation rows, and size classes of the reduced
    counts (stacked: merged over the runs, `flat.stack`).

  Raises:
    ValueError, before any work: fraction not a number in [0, 1), seeds not an int >= 0
    for one run or not one per run for stacked data; then data that are no store, already
    have a validation split, are traced, or fail their `check`.
  """
  if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not (
      0 <= fraction < 1):
    raise ValueError(f"validation_split: fraction must be a number in [0, 1) (the share of "
                     f"each client's training samples held out), got {fraction!r}")
  if not isinstance(data, (federated.ClientDatasets, flat.FlatClients)):
    raise ValueError(f"validation_split: data must be ClientDatasets or FlatClients, got a "
                     f"{type(data).__name__}")
  counts_shape = tuple(np.shape(data.counts))
  if len(counts_shape) not in (1, 2):
    raise ValueError(f"validation_split: data.counts has shape {counts_shape}: pass one "
                     f"run's data (counts [n]) or runs stacked by fr.stack_datasets "
                     f"(counts [runs, n])")
  runs = counts_shape[0] if len(counts_shape) == 2 else None
  seeds = _seeds(seeds, runs)
  if fraction == 0:
    return data
  if data.has_validation:
    raise ValueError("validation_split: data already have a validation split: split the "
                     "data without one")
  if not all(checks.concrete(leaf) for leaf in jax.tree.leaves(data)):
    raise ValueError("validation_split: data are traced: split concrete data on the host, "
                     "outside jit and vmap")
  host = jax.tree.map(np.asarray, data)
  parts = []
  for index, (run, seed) in enumerate(zip(checks.sweep_runs(host, None if runs is None
                                                            else 0), seeds)):
    with warnings.catch_warnings():  # the run's own check warns on what runs but means little
      warnings.simplefilter("ignore")
      try:
        run.check()
      except ValueError as error:
        raise ValueError(f"validation_split: {'' if runs is None else f'run {index}: '}"
                         f"{error}") from None
    one = _padded if isinstance(run, federated.ClientDatasets) else _flat
    parts.append(one(run, fraction, seed))
  if runs is None:
    return jax.device_put(parts[0])
  return federated.stack(parts)


def _seeds(seeds, runs: int | None) -> list[int]:
  """The seed of each run: [seeds] (runs None) or list(seeds) (runs of them); raises
  ValueError unless they are ints >= 0, one per run."""
  valid = lambda s: not isinstance(s, bool) and isinstance(s, (int, np.integer)) and s >= 0
  if runs is None:
    if not valid(seeds):
      raise ValueError(f"validation_split: seeds must be an int >= 0 for one run's data "
                       f"(counts [n]), got {seeds!r}")
    return [int(seeds)]
  if isinstance(seeds, (str, bytes)) or np.ndim(seeds) != 1 or len(seeds) != runs or not all(
      valid(s) for s in seeds):
    raise ValueError(f"validation_split: seeds must be {runs} ints >= 0, one per run of the "
                     f"stacked data (counts [{runs}, n]), got {seeds!r}")
  return [int(s) for s in seeds]


def _padded(data: federated.ClientDatasets, fraction: float,
            seed: int) -> federated.ClientDatasets:
  """One run's ClientDatasets (numpy leaves) split (`split`)."""
  x, y, counts = data.x, data.y, np.asarray(data.counts)
  n = x.shape[0]
  held = [held_out(seed, i, int(counts[i]), fraction) for i in range(n)]
  v = max(1, max(len(h) for h in held))
  new_x, new_y = np.zeros_like(x), np.zeros_like(y)
  x_val = np.zeros((n, v, *x.shape[2:]), x.dtype)
  y_val = np.zeros((n, v), y.dtype)
  for i, h in enumerate(held):
    kept = np.delete(np.arange(counts[i]), h)
    new_x[i, :len(kept)], new_y[i, :len(kept)] = x[i, kept], y[i, kept]
    x_val[i, :len(h)], y_val[i, :len(h)] = x[i, h], y[i, h]
  val_counts = np.array([len(h) for h in held], np.int32)
  return data.replace(x=new_x, y=new_y, counts=(counts - val_counts).astype(np.int32),
                      x_val=x_val, y_val=y_val, val_counts=val_counts)


def _flat(data: flat.FlatClients, fraction: float, seed: int) -> flat.FlatClients:
  """One run's FlatClients (numpy leaves) split (`split`): its store laid out again
  (`flat.laid_out`) in its blocks."""
  n, blocks = data.num_clients, data.blocks
  start = (np.arange(n) // (n // blocks)) * (data.x.shape[0] // blocks)  # the block's row
  rows = lambda offsets, counts: [start[i] + o + np.arange(c) for i, (o, c) in enumerate(
      zip(np.asarray(offsets, np.int64), np.asarray(counts, np.int64)))]
  train = rows(data.offsets, data.counts)
  held = [held_out(seed, i, len(r), fraction) for i, r in enumerate(train)]
  kept = [np.delete(r, h) for r, h in zip(train, held)]
  store_x, store_y, offsets = flat.laid_out(
      data.x, data.y, [kept, rows(data.test_offsets, data.test_counts),
                       [r[h] for r, h in zip(train, held)]], blocks)
  counts = np.array([len(r) for r in kept], np.int32)
  val_counts = np.array([len(h) for h in held], np.int32)
  test_counts = np.asarray(data.test_counts, np.int32)
  return flat.FlatClients(
      x=store_x, y=store_y, offsets=offsets[0], counts=counts, test_offsets=offsets[1],
      test_counts=test_counts, num_classes=data.num_classes,
      classes=flat.size_classes(counts, test_counts), blocks=blocks, val_offsets=offsets[2],
      val_counts=val_counts, val_classes=flat.validation_classes(counts, val_counts))
