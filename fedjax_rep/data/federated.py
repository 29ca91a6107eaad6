"""Federated classification data: every client's train and test samples, padded to one size.

`ClientDatasets` is the client data of the neural algorithms (see `core.protocols.ClientData`):
client i's real samples are the first counts[i] rows of x[i] (the rest are zero padding),
so every client has the same shape and a whole cohort is one array.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import checks
from fedjax_rep.core import struct
from fedjax_rep.core import tree


@struct.dataclass
class ClientDatasets:
  """Padded per-client datasets.

  x [n, m, *features] (the dtype of the input features: float32 images, int32 token ids),
  y [n, m] (int32 labels), counts [n] (int32 real samples);
  x_test [n, t, *features], y_test [n, t], test_counts [n] likewise (each client's test
  samples come from its own label distribution). num_classes is static.
  """
  x: jax.Array
  y: jax.Array
  counts: jax.Array
  x_test: jax.Array
  y_test: jax.Array
  test_counts: jax.Array
  num_classes: int = struct.static_field()

  @property
  def num_clients(self) -> int:
    return self.x.shape[0]

  @property
  def samples(self) -> int:
    """m: the padded number of training samples per client."""
    return self.x.shape[1]

  def check(self, classes: int | None = None) -> None:
    """Raises ValueError on datasets no algorithm can train on: no clients or training rows,
    shapes that disagree, counts outside [0, m] (test_counts: [0, t]), no training sample
    at all, non-finite inputs and labels outside [0, classes) (default num_classes; a
    model's outputs) naming the client and sample. Warns on clients without training
    samples, without test samples (left out of the test metrics) or whose training inputs
    are all zero. Values are checked where concrete (`core.checks`)."""
    classes = self.num_classes if classes is None else classes
    n, m = self.x.shape[:2]
    t = self.x_test.shape[1]
    checks.in_range("num_clients (x.shape[0])", n, 1, advice="pass at least one client")
    checks.in_range("training rows per client (x.shape[1])", m, 1,
                    advice="the clients need training samples")
    shapes = {"y": (n, m), "counts": (n,), "x_test": (n, t, *self.x.shape[2:]),
              "y_test": (n, t), "test_counts": (n,)}
    for name, shape in shapes.items():
      if tuple(getattr(self, name).shape) != shape:
        raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)} but x "
                         f"{tuple(self.x.shape)} needs {shape}: ClientDatasets holds x [clients, "
                         f"rows, *features], y [clients, rows], counts [clients], and the same "
                         f"for the test split")
    for name in ("x", "x_test"):
      checks.finite(name, getattr(self, name), ("client", "sample"))
    for name in ("y", "y_test"):
      labels = getattr(self, name)
      bad = np.argwhere((labels < 0) | (labels >= classes)) if checks.concrete(labels) else []
      if len(bad):
        client, sample = bad[0]
        raise ValueError(f"{name}[{client}, {sample}] = {labels[client, sample]} (client "
                         f"{client}, sample {sample}) is not a class in [0, {classes}) (the "
                         f"data's num_classes and the model's outputs); relabel the data or "
                         f"use a model with more classes")
    for name, rows in (("counts", m), ("test_counts", t)):
      counts = getattr(self, name)
      bad = np.flatnonzero((counts < 0) | (counts > rows)) if checks.concrete(counts) else []
      if len(bad):
        raise ValueError(f"{name}[{bad[0]}] = {counts[bad[0]]} (client {bad[0]}) is out of "
                         f"range: it must be in [0, {rows}] (the rows each client has)")
    if not checks.concrete(self.x, self.counts):
      return
    if not self.counts.any():
      raise ValueError("counts are all 0: no client has a training sample to train on")
    empty = np.flatnonzero(self.counts == 0)
    if empty.size:
      checks.warn(f"{empty.size} of {n} clients have no training samples "
                  f"({checks.clients_text(empty)}): they never train and weigh nothing in the "
                  f"server's averages, yet their test accuracy counts; drop them unless meant")
    untested = np.flatnonzero(self.test_counts == 0) if checks.concrete(self.test_counts) else []
    if len(untested):
      checks.warn(f"{len(untested)} of {n} clients have no test samples "
                  f"({checks.clients_text(untested)}): they are left out of the test metrics "
                  f"(test_clients counts the clients tested; NaN accuracies if none is)")
    if np.issubdtype(self.x.dtype, np.inexact):
      real = np.arange(m) < self.counts[:, None]
      nonzero = checks.any_nonzero(self.x, tuple(range(2, self.x.ndim)))  # [n, m]
      zero = np.flatnonzero(~(nonzero & real).any(axis=1) & (self.counts > 0))
      if zero.size:
        checks.warn(f"{zero.size} of {n} clients have only zeros in their training inputs x "
                    f"({checks.clients_text(zero)}): they carry no signal; drop them or check "
                    f"how the data were built")

  def sample_counts(self, clients: jax.Array) -> jax.Array:
    """Number of real training samples [c] (float32) of clients `clients` [c]."""
    return self.counts[clients].astype(jnp.float32)

  def batch(self, key: jax.Array, clients: jax.Array):
    """(x [c, m, ...], y [c, m], counts [c]) of clients `clients` [c]."""
    del key
    return self.x[clients], self.y[clients], self.counts[clients]


def stack(datasets: list[ClientDatasets]) -> ClientDatasets:
  """One ClientDatasets with a leading axis over `datasets` (e.g. seeds).

  Each is padded with zero rows to the largest m and t among them.

  Args:
    datasets: s ClientDatasets of n clients each, of one num_classes.

  Returns:
    ClientDatasets with x [s, n, m, ...], y [s, n, m], counts [s, n], x_test [s, n, t, ...],
    y_test [s, n, t] and test_counts [s, n]; num_classes of the first.
  """
  size = max(d.x.shape[1] for d in datasets)
  test_size = max(d.x_test.shape[1] for d in datasets)

  def padded(a, to):
    return np.pad(np.asarray(a), [(0, 0), (0, to - a.shape[1])] + [(0, 0)] * (a.ndim - 2))

  return tree.stack([d.replace(x=padded(d.x, size), y=padded(d.y, size),
                                x_test=padded(d.x_test, test_size),
                                y_test=padded(d.y_test, test_size),
                                num_classes=datasets[0].num_classes) for d in datasets])


def pad(x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], size: int | None = None):
  """(x [n, size, ...], y [n, size], counts [n]) of clients whose samples are the rows
  `parts[i]` of x [N, ...], y [N]; x keeps its dtype, y becomes int32, padding rows are
  zero. size defaults to the largest part."""
  counts = np.array([len(p) for p in parts], np.int32)
  size = int(counts.max()) if size is None else size
  if counts.max() > size:
    raise ValueError(f"a client has {counts.max()} samples, more than size={size}")
  xs = np.zeros((len(parts), size, *x.shape[1:]), x.dtype)
  ys = np.zeros((len(parts), size), np.int32)
  for i, p in enumerate(parts):
    xs[i, :len(p)] = x[p]
    ys[i, :len(p)] = y[p]
  return xs, ys, counts


def client_datasets(x, y, parts, x_test, y_test, test_parts, num_classes: int,
                    size: int | None = None, test_size: int | None = None) -> ClientDatasets:
  """ClientDatasets of clients given by index arrays into a dataset's train and test rows.

  Client i trains on rows parts[i] of (x, y) and is tested on rows test_parts[i] of
  (x_test, y_test); padding rows are zero.

  Args:
    x: training inputs [N, ...] (numpy; any dtype, kept).
    y: training labels [N] (integers; stored as int32).
    parts: n index arrays into x, y (e.g. from `partition`).
    x_test: test inputs [T, ...].
    y_test: test labels [T].
    test_parts: n index arrays into x_test, y_test.
    num_classes: the number of classes (static).
    size: rows m per client; default the largest part.
    test_size: test rows t per client; default the largest test part.

  Returns:
    ClientDatasets with x [n, m, ...], y [n, m], counts [n] (int32), x_test [n, t, ...],
    y_test [n, t] and test_counts [n].

  Raises:
    ValueError: parts and test_parts differ in length, or a part exceeds its size.
  """
  if len(parts) != len(test_parts):
    raise ValueError(f"{len(parts)} train parts but {len(test_parts)} test parts")
  xs, ys, counts = pad(np.asarray(x), np.asarray(y), parts, size)
  xt, yt, test_counts = pad(np.asarray(x_test), np.asarray(y_test), test_parts, test_size)
  return jax.device_put(ClientDatasets(x=xs, y=ys, counts=counts, x_test=xt, y_test=yt,
                                       test_counts=test_counts, num_classes=num_classes))
