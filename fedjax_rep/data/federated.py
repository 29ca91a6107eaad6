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
from fedjax_rep.data import flat

VALIDATION_FIELDS = ("x_val", "y_val", "val_counts")  # ClientDatasets' validation split


@struct.dataclass
class ClientDatasets:
  """Padded per-client datasets.

  x [n, m, *features] (the dtype of the input features: float32 images, int32 token ids),
  y [n, m] (int32 labels), counts [n] (int32 real samples);
  x_test [n, t, *features], y_test [n, t], test_counts [n] likewise (each client's test
  samples come from its own label distribution). num_classes is static. Optionally a
  validation split carved from the training samples (`data.validation.split`): x_val [n, v,
  *features], y_val [n, v], val_counts [n], all three None (the default) without one.
  """
  x: jax.Array
  y: jax.Array
  counts: jax.Array
  x_test: jax.Array
  y_test: jax.Array
  test_counts: jax.Array
  num_classes: int = struct.static_field()
  x_val: jax.Array | None = None
  y_val: jax.Array | None = None
  val_counts: jax.Array | None = None

  @property
  def num_clients(self) -> int:
    return self.x.shape[0]

  @property
  def samples(self) -> int:
    """m: the padded number of training samples per client."""
    return self.x.shape[1]

  @property
  def has_validation(self) -> bool:
    """Whether the data have a validation split (x_val, y_val, val_counts)."""
    return self.val_counts is not None

  def validation_view(self) -> "ClientDatasets":
    """The same clients with their validation split standing in as the test split (x_test,
    y_test, test_counts = x_val, y_val, val_counts) and no validation split: what
    `map_clients(..., test=True)` tests on validation rows with. Raises ValueError without a
    validation split."""
    if not self.has_validation:
      raise ValueError("validation_view: these data have no validation split: make one with "
                       "fr.validation_split(data, fraction, seeds)")
    return self.replace(x_test=self.x_val, y_test=self.y_val, test_counts=self.val_counts,
                        x_val=None, y_val=None, val_counts=None)

  def check_layout(self) -> None:
    """Raises ValueError unless the arrays' shapes agree: x [n, m, *features] with n, m >= 1,
    y [n, m], counts [n], x_test [n, t, *features], y_test [n, t], test_counts [n], and
    x_val [n, v, *features], y_val [n, v], val_counts [n] all given or all None."""
    if len(self.x.shape) < 2 or len(self.x_test.shape) < 2:
      raise ValueError(f"x and x_test must be [clients, rows, *features]; got x "
                       f"{tuple(self.x.shape)} and x_test {tuple(self.x_test.shape)}")
    n, m = self.x.shape[:2]
    t = self.x_test.shape[1]
    checks.in_range("num_clients (x.shape[0])", n, 1, advice="pass at least one client")
    checks.in_range("training rows per client (x.shape[1])", m, 1,
                    advice="the clients need training samples")
    shapes = {"y": (n, m), "counts": (n,), "x_test": (n, t, *self.x.shape[2:]),
              "y_test": (n, t), "test_counts": (n,)}
    given = [name for name in VALIDATION_FIELDS if getattr(self, name) is not None]
    if given and len(given) < len(VALIDATION_FIELDS):
      raise ValueError(f"ClientDatasets has {', '.join(given)} but not all of x_val, y_val, "
                       f"val_counts: pass the three of the validation split, or none")
    if given:
      if len(self.x_val.shape) < 2:
        raise ValueError(f"x_val must be [clients, rows, *features]; got x_val "
                         f"{tuple(self.x_val.shape)}")
      v = self.x_val.shape[1]
      shapes.update(x_val=(n, v, *self.x.shape[2:]), y_val=(n, v), val_counts=(n,))
    for name, shape in shapes.items():
      if tuple(getattr(self, name).shape) != shape:
        raise ValueError(f"{name} has shape {tuple(getattr(self, name).shape)} but x "
                         f"{tuple(self.x.shape)} needs {shape}: ClientDatasets holds x [clients, "
                         f"rows, *features], y [clients, rows], counts [clients], and the same "
                         f"for the test (and validation) split")

  def check(self, classes: int | None = None) -> None:
    """Raises ValueError on datasets no algorithm can train on: no clients or training rows,
    shapes that disagree, counts outside [0, m] (test_counts: [0, t]; val_counts: [0, v]),
    no training sample at all, non-finite inputs and labels outside [0, classes) (default
    num_classes; a model's outputs) naming the client and sample. Warns on clients without
    training samples, without test samples (left out of the test metrics), without
    validation samples where the data have a validation split (left out of the validation
    metrics) or whose training inputs are all zero. Values are checked where concrete
    (`core.checks`)."""
    classes = self.num_classes if classes is None else classes
    self.check_layout()
    n, m = self.x.shape[:2]
    t = self.x_test.shape[1]
    validation = self.has_validation
    for name in ("x", "x_test") + (("x_val",) if validation else ()):
      checks.finite(name, getattr(self, name), ("client", "sample"))
    for name in ("y", "y_test") + (("y_val",) if validation else ()):
      labels = getattr(self, name)
      bad = np.argwhere((labels < 0) | (labels >= classes)) if checks.concrete(labels) else []
      if len(bad):
        client, sample = bad[0]
        raise ValueError(f"{name}[{client}, {sample}] = {labels[client, sample]} (client "
                         f"{client}, sample {sample}) is not a class in [0, {classes}) (the "
                         f"data's num_classes and the model's outputs); relabel the data or "
                         f"use a model with more classes")
    splits = (("counts", m), ("test_counts", t))
    if validation:
      splits += (("val_counts", self.x_val.shape[1]),)
    for name, rows in splits:
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
    unvalidated = (np.flatnonzero(self.val_counts == 0)
                   if validation and checks.concrete(self.val_counts) else [])
    if len(unvalidated):
      checks.warn(f"{len(unvalidated)} of {n} clients have no validation samples "
                  f"({checks.clients_text(unvalidated)}): they are left out of the validation "
                  f"metrics (val_clients counts the clients validated; NaN accuracies if none "
                  f"is)")
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

  def input_spec(self, runs: int = 0) -> jax.ShapeDtypeStruct:
    """The shape and dtype of one input (x after its `runs` leading run axes, client and
    row axes)."""
    return jax.ShapeDtypeStruct(self.x.shape[runs + 2:], self.x.dtype)

  def client_spec(self) -> tuple:
    """Shapes and dtypes of one client's (x [m, ...], y [m], count [])."""
    return (jax.ShapeDtypeStruct(self.x.shape[1:], self.x.dtype),
            jax.ShapeDtypeStruct(self.y.shape[1:], self.y.dtype),
            jax.ShapeDtypeStruct((), self.counts.dtype))

  def map_clients(self, fn, per_client, clients: jax.Array, group: int | None,
                  test: bool = False, validation: bool = False):
    """fn(args, x [m, ...], y [m], count) for each of the clients `clients` [c], with its
    leaves of `per_client` (leading axis c) and its padded training data (test=True: also
    x_test [t, ...], y_test [t], test_count; validation=True: then also x_val [v, ...],
    y_val [v], val_count), in groups of `group` (`tree.client_map`; each group fetches its
    own clients' data). Returns fn's outputs, leaves [c, ...]."""
    if validation and not self.has_validation:
      raise ValueError("map_clients: validation=True but these data have no validation "
                       "split: make one with fr.validation_split(data, fraction, seeds)")

    def client(args):
      client_args, i = args
      data = (self.x[i], self.y[i], self.counts[i])
      if test:
        data += (self.x_test[i], self.y_test[i], self.test_counts[i])
      if validation:
        data += (self.x_val[i], self.y_val[i], self.val_counts[i])
      return fn(client_args, *data)

    return tree.client_map(client, (per_client, clients), group)


def stack(datasets: list[ClientDatasets]) -> ClientDatasets:
  """One ClientDatasets with a leading axis over `datasets` (e.g. one per seed).

  Each is padded with zero rows to the largest m and t (and v) among them. A list of
  FlatClients is stacked by `flat.stack` instead (one FlatClients with a leading run axis).

  Args:
    datasets: s >= 1 ClientDatasets of the same n clients, input shape and dtype and
      num_classes (e.g. one partition per seed).

  Returns:
    ClientDatasets with x [s, n, m, ...], y [s, n, m], counts [s, n], x_test [s, n, t, ...],
    y_test [s, n, t] and test_counts [s, n]; with validation splits also x_val [s, n, v,
    ...], y_val [s, n, v] and val_counts [s, n] (v: the largest among them).

  Raises:
    ValueError: no datasets, one that is not a ClientDatasets or whose shapes disagree
      (`ClientDatasets.check_layout`), or datasets that differ in n, input shape or dtype,
      num_classes, or in having a validation split.
  """
  one = isinstance(datasets, (ClientDatasets, flat.FlatClients))
  if not one and len(datasets) and all(isinstance(d, flat.FlatClients) for d in datasets):
    return flat.stack(datasets)
  if one or not len(datasets):
    got = f"one {type(datasets).__name__}" if one else "none"
    raise ValueError(f"stack takes a non-empty list of ClientDatasets (e.g. one per seed); got "
                     f"{got}")
  kinds = lambda d: {"clients": d.x.shape[0], "input shape": tuple(d.x.shape[2:]),
                     "input dtype": np.dtype(d.x.dtype), "num_classes": d.num_classes}
  for i, d in enumerate(datasets):
    if not isinstance(d, ClientDatasets):
      raise ValueError(f"stack: datasets[{i}] is a {type(d).__name__}, not a ClientDatasets")
    try:
      d.check_layout()
    except ValueError as error:
      raise ValueError(f"stack: datasets[{i}]: {error}") from None
    for what, value in kinds(d).items():
      if value != kinds(datasets[0])[what]:
        raise ValueError(f"stack: datasets[{i}] has {what} {value} but datasets[0] has "
                         f"{kinds(datasets[0])[what]}: stack datasets of the same clients, "
                         f"input shape and dtype and classes (e.g. one partition per seed)")
    if d.has_validation != datasets[0].has_validation:
      has = lambda d: "a validation split" if d.has_validation else "no validation split"
      raise ValueError(f"stack: datasets[{i}] has {has(d)} but datasets[0] has "
                       f"{has(datasets[0])}: split all of them (fr.validation_split) or none")
  size = max(d.x.shape[1] for d in datasets)
  test_size = max(d.x_test.shape[1] for d in datasets)

  def padded(a, to):
    return np.pad(np.asarray(a), [(0, 0), (0, to - a.shape[1])] + [(0, 0)] * (a.ndim - 2))

  validation = datasets[0].has_validation
  val_size = max(d.x_val.shape[1] for d in datasets) if validation else 0
  val = lambda d: dict(x_val=padded(d.x_val, val_size), y_val=padded(d.y_val, val_size)) if (
      validation) else {}
  return tree.stack([d.replace(x=padded(d.x, size), y=padded(d.y, size),
                                x_test=padded(d.x_test, test_size),
                                y_test=padded(d.y_test, test_size), **val(d))
                     for d in datasets])


def pad(x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], size: int | None = None):
  """(x [n, size, ...], y [n, size], counts [n]) of clients whose samples are the rows
  `parts[i]` (integer arrays, in range, no longer than size) of x [N, ...], y [N]; x keeps
  its dtype, y becomes int32, padding rows are zero. size defaults to the largest part."""
  counts = np.array([len(p) for p in parts], np.int32)
  size = int(counts.max()) if size is None else size
  xs = np.zeros((len(parts), size, *x.shape[1:]), x.dtype)
  ys = np.zeros((len(parts), size), np.int32)
  for i, p in enumerate(parts):
    p = np.asarray(p, np.intp)  # a list, or an empty part that np.asarray([]) made float
    xs[i, :len(p)] = x[p]
    ys[i, :len(p)] = y[p]
  return xs, ys, counts


def _check_split(names: tuple, x, y, parts, size, num_classes: int, train_shape=None) -> None:
  """Raises ValueError unless one split's numpy arrays fit together: x [N, ...] (the test
  split's with x's `train_shape` after the first axis), y [N] of integer labels in
  [0, num_classes), parts of 1-D integer row indices in [0, N), size None or an integer >=
  the largest part (training: >= 1, and some part not empty). `names`: the arguments'
  names, (x, y, parts, size) or (x_test, y_test, test_parts, test_size)."""
  x_, y_, parts_, size_ = names
  if x.ndim < 1 or y.shape != x.shape[:1]:
    raise ValueError(f"client_datasets: {y_} has shape {y.shape} but {x_} has shape {x.shape}: "
                     f"pass {y_} [N] with one label per row of {x_} [N, ...]")
  if train_shape is not None and x.shape[1:] != train_shape[1:]:
    raise ValueError(f"client_datasets: {x_} has shape {x.shape} but x has shape {train_shape}: "
                     f"pass {x_} [T, {', '.join(map(str, train_shape[1:]))}], the shape of x "
                     f"after its first axis")
  if not np.issubdtype(y.dtype, np.integer):
    raise ValueError(f"client_datasets: {y_} has dtype {y.dtype}: labels must be integers "
                     f"(class indices in [0, num_classes={num_classes}))")
  bad = np.flatnonzero((y < 0) | (y >= num_classes))
  if bad.size:
    raise ValueError(f"client_datasets: {y_}[{bad[0]}] = {y[bad[0]]} is not a class in "
                     f"[0, num_classes={num_classes}): relabel the data or raise num_classes")
  for i, p in enumerate(parts):
    if p.ndim != 1 or (p.size and not np.issubdtype(p.dtype, np.integer)):
      raise ValueError(f"client_datasets: {parts_}[{i}] has shape {p.shape} and dtype "
                       f"{p.dtype}: each part must be a 1-D array of integer row indices")
    bad = np.flatnonzero((p < 0) | (p >= len(y)))
    if bad.size:
      raise ValueError(f"client_datasets: {parts_}[{i}][{bad[0]}] = {p[bad[0]]} is out of "
                       f"range: row indices into {x_}, {y_} ({len(y)} rows) must be in "
                       f"[0, {len(y)})")
  training = train_shape is None
  longest = max(range(len(parts)), key=lambda i: len(parts[i]))
  if size is None:
    if training and not len(parts[longest]):
      raise ValueError(f"client_datasets: every part of {parts_} is empty: the clients need "
                       f"training rows")
    return
  checks.positive_ints("client_datasets", low=int(training), **{size_: size})
  if len(parts[longest]) > size:
    raise ValueError(f"client_datasets: {size_} = {size} is less than the "
                     f"{len(parts[longest])} rows of {parts_}[{longest}]: pass {size_} >= "
                     f"{len(parts[longest])}, or None (the largest part)")


def client_datasets(x, y, parts, x_test, y_test, test_parts, num_classes: int,
                    size: int | None = None, test_size: int | None = None) -> ClientDatasets:
  """ClientDatasets of clients given by index arrays into a dataset's train and test rows.

  Client i trains on rows parts[i] of (x, y) and is tested on rows test_parts[i] of
  (x_test, y_test); padding rows are zero.

  Args:
    x: training inputs [N, ...] (numpy or jax; any dtype, kept).
    y: training labels [N] (integers in [0, num_classes); stored as int32).
    parts: n >= 1 index arrays into x, y (1-D integers in [0, N), e.g. from `partition`).
    x_test: test inputs [T, ...] (the shape of x after its first axis).
    y_test: test labels [T].
    test_parts: n index arrays into x_test, y_test.
    num_classes: the number of classes (static).
    size: rows m per client; default the largest part.
    test_size: test rows t per client; default the largest test part.

  Returns:
    ClientDatasets with x [n, m, ...], y [n, m], counts [n] (int32), x_test [n, t, ...],
    y_test [n, t] and test_counts [n].

  Raises:
    ValueError, before anything is indexed: num_classes not an integer >= 1, no parts,
    parts and test_parts of different lengths, y not [N] with x [N, ...] (likewise the test
    split), x_test's shape after its first axis not x's, labels that are no integers or
    outside [0, num_classes), a part that is no 1-D integer array or holds a row index
    outside [0, N), every part empty, a size below its largest part (size < 1).
  """
  checks.positive_ints("client_datasets", num_classes=num_classes)
  if not len(parts):
    raise ValueError("client_datasets: parts is empty: pass one index array per client")
  if len(parts) != len(test_parts):
    raise ValueError(f"client_datasets: {len(parts)} train parts but {len(test_parts)} test "
                     f"parts: pass one index array of each per client")
  x, y, x_test, y_test = map(np.asarray, (x, y, x_test, y_test))
  parts, test_parts = [np.asarray(p) for p in parts], [np.asarray(p) for p in test_parts]
  _check_split(("x", "y", "parts", "size"), x, y, parts, size, num_classes)
  _check_split(("x_test", "y_test", "test_parts", "test_size"), x_test, y_test, test_parts,
               test_size, num_classes, x.shape)
  xs, ys, counts = pad(x, y, parts, size)
  xt, yt, test_counts = pad(x_test, y_test, test_parts, test_size)
  return jax.device_put(ClientDatasets(x=xs, y=ys, counts=counts, x_test=xt, y_test=yt,
                                       test_counts=test_counts, num_classes=num_classes))


def natural(x, y, parts, x_test, y_test, test_parts, num_classes: int):
  """Clients at their natural sizes, given as `client_datasets` takes them: ClientDatasets
  where every client has as many training rows as the others (no training row is padded),
  else a flat store whose memory and work follow the real samples (`flat.flat_clients`)."""
  if len({len(p) for p in parts}) == 1:
    return client_datasets(x, y, parts, x_test, y_test, test_parts, num_classes)
  return flat.flat_clients(x, y, parts, x_test, y_test, test_parts, num_classes)
