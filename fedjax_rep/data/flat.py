"""Federated classification data at the clients' natural sizes: all samples in one flat store.

`FlatClients` holds every client's train and test samples as rows of one store x [N, ...],
y [N]: client i trains on the counts[i] rows from offsets[i] and is tested on the
test_counts[i] rows from test_offsets[i], so memory follows the real samples
(`federated.ClientDatasets` pads every client to the largest). `map_clients` runs a
function over clients by size classes: a client of m training rows is in the class of
R = max(MIN_ROWS, the next power of two >= m) rows; the clients, sorted by size, run in
groups of similar sizes (`group_size` together, one vmap per group, the class's groups in a
loop), each given its rows gathered from the store and zero-padded to R. With local SGD
that runs only the steps its real rows fill (`nn.train.sgd_epochs`), a client's work
follows its own size, with programs compiled once per class; its numbers are those of the
same client padded to any size (its shuffles do not depend on the padding), up to float32
round-off.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import checks
from fedjax_rep.core import struct
from fedjax_rep.core import tree

VALIDATION_FIELDS = ("val_offsets", "val_counts", "val_classes")  # FlatClients' validation split
MIN_ROWS = 16  # the smallest size class
GROUP_ROWS = 1024  # classes of R > GROUP_ROWS rows run group * GROUP_ROWS // R clients at once


def class_rows(count) -> int:
  """R: the rows of the size class of a client of `count` training rows (an int >= 0):
  max(MIN_ROWS, the smallest power of two >= count)."""
  return max(MIN_ROWS, 1 << max(int(count) - 1, 0).bit_length())


def group_size(rows: int, group: int, expected: int) -> int:
  """Clients of a size class of `rows` rows that run together (at least 1): at most
  `group`, fewer above GROUP_ROWS rows (group * GROUP_ROWS // rows: a group holds at most as
  many rows as `group` clients of GROUP_ROWS), and at most `expected`, the clients of the
  class a map is expected to meet (a group's empty places cost as much as its clients)."""
  return max(1, min(group, group * GROUP_ROWS // rows, expected))


def size_classes(counts: np.ndarray, test_counts: np.ndarray) -> tuple:
  """((R, T, share), ...): the size classes of clients of `counts` [n] training rows,
  ascending, each with T, the most test rows of its clients (`test_counts` [n]), and
  share, the fraction of the n clients in it."""
  rows = np.array([class_rows(c) for c in counts], np.int64)
  return tuple((int(r), int(test_counts[rows == r].max()), float(np.mean(rows == r)))
               for r in np.unique(rows))


def validation_classes(counts: np.ndarray, val_counts: np.ndarray) -> tuple:
  """((R, V), ...): for each size class R of clients of `counts` [n] training rows
  (`size_classes`), ascending, V, the most validation rows of its clients (`val_counts`
  [n])."""
  rows = np.array([class_rows(c) for c in counts], np.int64)
  return tuple((int(r), int(np.asarray(val_counts)[rows == r].max())) for r in np.unique(rows))


@struct.dataclass
class FlatClients:
  """Clients' samples as rows of one store (see the module docstring).

  x [N, *features] (the input dtype), y [N] (int32); offsets, counts [n] (int32): client i's
  training rows; test_offsets, test_counts [n]: its test rows. num_classes is static;
  classes ((R, T, share), ...) too: the size classes of the clients (`size_classes`;
  stacked runs: those of every run, each T and share the largest); and blocks: 1, or the
  devices the store is laid out for (`for_devices`: device d's clients' rows in block d of
  N / blocks rows, their offsets counted from the block's start). Optionally a validation
  split carved from the training samples (`data.validation.split`): val_offsets, val_counts
  [n], client i's validation rows in the same store, and the static val_classes ((R, V),
  ...): for each size class R, V the most validation rows of its clients
  (`validation_classes`; stacked runs: the largest); all three None (the default) without
  one.
  """
  x: jax.Array
  y: jax.Array
  offsets: jax.Array
  counts: jax.Array
  test_offsets: jax.Array
  test_counts: jax.Array
  num_classes: int = struct.static_field()
  classes: tuple = struct.static_field()
  blocks: int = struct.static_field(default=1)
  val_offsets: jax.Array | None = None
  val_counts: jax.Array | None = None
  val_classes: tuple | None = struct.static_field(default=None)

  @property
  def num_clients(self) -> int:
    return self.counts.shape[-1]

  @property
  def has_validation(self) -> bool:
    """Whether the data have a validation split (val_offsets, val_counts, val_classes)."""
    return self.val_counts is not None

  def validation_view(self) -> "FlatClients":
    """The same clients with their validation rows standing in as the test rows
    (test_offsets, test_counts = val_offsets, val_counts; each class's T its V) and no
    validation split: what `map_clients(..., test=True)` tests on validation rows with.
    Raises ValueError without a validation split."""
    if not self.has_validation:
      raise ValueError("validation_view: these data have no validation split: make one with "
                       "fr.validation_split(data, fraction, seeds)")
    held = dict(self.val_classes)
    return self.replace(test_offsets=self.val_offsets, test_counts=self.val_counts,
                        classes=tuple((r, held[r], share) for r, _, share in self.classes),
                        val_offsets=None, val_counts=None, val_classes=None)

  def input_spec(self, runs: int = 0) -> jax.ShapeDtypeStruct:
    """The shape and dtype of one input (x after its `runs` leading run axes and row axis)."""
    return jax.ShapeDtypeStruct(self.x.shape[runs + 1:], self.x.dtype)

  def client_spec(self) -> tuple:
    """Shapes and dtypes of one client's (x [R, ...], y [R], count []) in the largest class."""
    rows = self.classes[-1][0]
    return (jax.ShapeDtypeStruct((rows, *self.x.shape[1:]), self.x.dtype),
            jax.ShapeDtypeStruct((rows,), self.y.dtype),
            jax.ShapeDtypeStruct((), self.counts.dtype))

  def check_layout(self) -> None:
    """Raises ValueError unless the arrays fit together: x [N, *features], y [N], offsets,
    counts, test_offsets, test_counts [n] with n >= 1, and val_offsets, val_counts [n] with
    val_classes holding every size class of `classes`, all three given or all None."""
    if self.x.ndim < 1 or tuple(self.y.shape) != tuple(self.x.shape[:1]):
      raise ValueError(f"FlatClients: y has shape {tuple(self.y.shape)} but x "
                       f"{tuple(self.x.shape)} needs ({self.x.shape[0] if self.x.ndim else 0},):"
                       f" the store holds x [rows, *features] and y [rows]")
    n = self.counts.shape[0] if self.counts.ndim == 1 else 0
    checks.in_range("num_clients (counts.shape[0])", n, 1, advice="pass at least one client")
    given = [name for name in VALIDATION_FIELDS if getattr(self, name) is not None]
    if given and len(given) < len(VALIDATION_FIELDS):
      raise ValueError(f"FlatClients has {', '.join(given)} but not all of val_offsets, "
                       f"val_counts, val_classes: pass the three of the validation split, or "
                       f"none")
    names = ("offsets", "test_offsets", "test_counts") + (
        ("val_offsets", "val_counts") if given else ())
    for name in names:
      if tuple(getattr(self, name).shape) != (n,):
        raise ValueError(f"FlatClients: {name} has shape {tuple(getattr(self, name).shape)} "
                         f"but counts has ({n},): one entry per client")
    missing = sorted({r for r, _, _ in self.classes} - {r for r, _ in self.val_classes or ()})
    if given and missing:
      raise ValueError(f"FlatClients: val_classes {self.val_classes} miss the size classes "
                       f"{missing} of classes: build the split with fr.validation_split")

  def check(self, classes: int | None = None) -> None:
    """Raises ValueError on data no algorithm can train on: shapes that disagree, a client
    whose rows (offset, count; likewise test and validation rows) leave the store, no
    training sample at all, size classes that miss a client's (or have fewer test or
    validation rows), non-finite inputs and labels outside [0, classes) (default
    num_classes). Warns on clients without training or test samples, or without validation
    samples where the data have a validation split. Values are checked where concrete
    (`core.checks`)."""
    classes = self.num_classes if classes is None else classes
    self.check_layout()
    checks.finite("x", self.x, ("row",))
    if checks.concrete(self.y):
      bad = np.flatnonzero((self.y < 0) | (self.y >= classes))
      if bad.size:
        raise ValueError(f"y[{bad[0]}] = {self.y[bad[0]]} (row {bad[0]} of the store) is not "
                         f"a class in [0, {classes}) (the data's num_classes and the model's "
                         f"outputs); relabel the data or use a model with more classes")
    validation = self.has_validation
    spans = (("", self.offsets, self.counts), ("test_", self.test_offsets, self.test_counts))
    if validation:
      spans += (("val_", self.val_offsets, self.val_counts),)
    if not checks.concrete(*(a for _, offsets, counts in spans for a in (offsets, counts))):
      return
    rows = self.x.shape[0] // self.blocks
    for split, offsets, counts in spans:
      offsets, counts = np.asarray(offsets, np.int64), np.asarray(counts, np.int64)
      bad = np.flatnonzero((counts < 0) | (offsets < 0) | (offsets + counts > rows))
      if bad.size:
        i = bad[0]
        raise ValueError(f"client {i}'s {split}rows ({split}offsets[{i}] = {offsets[i]}, "
                         f"{split}counts[{i}] = {counts[i]}) are not within the "
                         f"{rows} rows of its block of the store: offsets and counts must be "
                         f">= 0 with offset + count <= {rows}")
    counts = np.asarray(self.counts)
    if not counts.any():
      raise ValueError("counts are all 0: no client has a training sample to train on")
    held = {rows: test_rows for rows, test_rows, _ in self.classes}
    needed = size_classes(counts, np.asarray(self.test_counts))
    if any(held.get(rows, -1) < test_rows for rows, test_rows, _ in needed):
      raise ValueError(f"FlatClients: classes {self.classes} do not hold the size classes of "
                       f"the counts ({needed}): build the data with `flat_clients` or "
                       f"`segments`")
    if validation:
      held = dict(self.val_classes)
      needed = validation_classes(counts, np.asarray(self.val_counts))
      if any(held.get(rows, -1) < val_rows for rows, val_rows in needed):
        raise ValueError(f"FlatClients: val_classes {self.val_classes} do not hold the "
                         f"validation rows of the size classes of the counts ({needed}): "
                         f"build the split with fr.validation_split")
    empties = [("training", np.flatnonzero(counts == 0)),
               ("test", np.flatnonzero(np.asarray(self.test_counts) == 0))]
    if validation:
      empties.append(("validation", np.flatnonzero(np.asarray(self.val_counts) == 0)))
    for what, empty in empties:
      if empty.size:
        checks.warn(f"{empty.size} of {self.num_clients} clients have no {what} samples "
                    f"({checks.clients_text(empty)})" + (
                        ": they never train and weigh nothing in the server's averages"
                        if what == "training" else f": they are left out of the {what} "
                        f"metrics"))

  def sample_counts(self, clients: jax.Array) -> jax.Array:
    """Number of real training samples [c] (float32) of clients `clients` [c]."""
    return self.counts[clients].astype(jnp.float32)

  def rows(self, offsets: jax.Array, counts: jax.Array, size: int):
    """(x [g, size, ...], y [g, size]) of g clients: the counts [g] store rows from offsets
    [g] each, zero past them."""
    index = offsets[:, None] + jnp.arange(size)
    index = jnp.where(jnp.arange(size) < counts[:, None], index, self.x.shape[0])
    take = lambda a: jnp.take(a, index, axis=0, mode="fill", fill_value=0)
    return take(self.x), take(self.y)

  def map_clients(self, fn, per_client, clients: jax.Array, group: int | None,
                  test: bool = False, validation: bool = False):
    """fn(args, x [R, ...], y [R], count) for each of the clients `clients` [c], with its
    leaves of `per_client` (leading axis c) and its training rows (test=True: also x_test
    [T, ...], y_test [T], test_count, its test rows; validation=True: then also x_val [V,
    ...], y_val [V], val_count, its validation rows), by size classes (module docstring);
    `group` (None: c) clients of a class of at most GROUP_ROWS rows run together. Returns
    fn's outputs stacked in the order of `clients` (leaves [c, ...]). A class's groups hold
    no more clients than c times its share of the clients (rounded up)."""
    if self.blocks != 1:
      raise ValueError(f"this store is laid out for {self.blocks} devices (`for_devices`): "
                       f"run it sharded, with devices={self.blocks}")
    if validation and not self.has_validation:
      raise ValueError("map_clients: validation=True but these data have no validation "
                       "split: make one with fr.validation_split(data, fraction, seeds)")
    val_classes = dict(self.val_classes or ())
    c = clients.shape[0]
    group = c if group is None else min(group, c)
    counts = self.counts[clients]
    order = jnp.argsort(counts, stable=True)
    ranked = counts[order]
    out = None
    for rows, test_rows, share in self.classes:
      size = group_size(rows, group, math.ceil(c * share))
      low = -1 if rows == MIN_ROWS else rows // 2
      start = jnp.searchsorted(ranked, low, side="right")
      stop = jnp.searchsorted(ranked, rows, side="right")

      def run(index, out, rows=rows, test_rows=test_rows, size=size, start=start, stop=stop,
              val_rows=val_classes.get(rows)):  # noqa: B008  (this iteration's values)
        position = start + index * size + jnp.arange(size)
        real = position < stop
        at = order[jnp.minimum(position, c - 1)]
        client = clients[at]
        count = jnp.where(real, self.counts[client], 0)
        data = (*self.rows(self.offsets[client], count, rows), count)
        if test:
          test_count = jnp.where(real, self.test_counts[client], 0)
          data += (*self.rows(self.test_offsets[client], test_count, test_rows), test_count)
        if validation:
          val_count = jnp.where(real, self.val_counts[client], 0)
          data += (*self.rows(self.val_offsets[client], val_count, val_rows), val_count)
        args = (tree.gather(per_client, at), *data)
        if size == 1:  # XLA:CPU runs a vmap of one as slower batched dots
          result = jax.tree.map(lambda r: r[None], fn(*jax.tree.map(lambda a: a[0], args)))
        else:
          result = jax.vmap(fn)(*args)
        if out is None:
          return result
        return jax.tree.map(lambda o, r: o.at[jnp.where(real, at, c)].set(r, mode="drop"),
                            out, result)

      if out is None:  # the outputs' shapes, from one group's
        shapes = jax.eval_shape(run, 0, None)
        out = jax.tree.map(lambda s: jnp.zeros((c, *s.shape[1:]), s.dtype), shapes)
      out = jax.lax.fori_loop(0, (stop - start + size - 1) // size, run, out)
    return out


def aligned_empty(shape: tuple, dtype) -> np.ndarray:
  """An uninitialised numpy array whose data start on a 64-byte boundary: one that JAX's
  CPU backend places without a copy (`jax.device_put` aliases it)."""
  dtype = np.dtype(dtype)
  size = int(np.prod(shape)) * dtype.itemsize
  buffer = np.empty(size + 64, np.uint8)
  start = -buffer.ctypes.data % 64
  return buffer[start:start + size].view(dtype).reshape(shape)


def segments(x, y, offsets, counts, test_offsets, test_counts, num_classes: int,
             val_offsets=None, val_counts=None) -> FlatClients:
  """FlatClients of the store x [N, ...], y [N] (numpy; y becomes int32) whose client i
  trains on the counts[i] rows from offsets[i] and is tested on the test_counts[i] rows
  from test_offsets[i] (no copy of x on the host); with val_offsets and val_counts [n], its
  validation split is the val_counts[i] rows from val_offsets[i]. Raises ValueError on
  arrays that do not fit together (`FlatClients.check`)."""
  checks.positive_ints("segments", num_classes=num_classes)
  if (val_offsets is None) != (val_counts is None):
    raise ValueError("segments: pass both val_offsets and val_counts (a validation split) "
                     "or neither")
  spans = (offsets, counts, test_offsets, test_counts) + (
      () if val_counts is None else (val_offsets, val_counts))
  index = [np.asarray(a, np.int32) for a in spans]
  if any(a.ndim != 1 for a in index):
    raise ValueError("segments: offsets, counts, test_offsets and test_counts (and "
                     "val_offsets, val_counts) must be 1-D (one entry per client)")
  validation = {} if val_counts is None else dict(
      val_offsets=index[4], val_counts=index[5],
      val_classes=validation_classes(index[1], index[5]) if index[1].size else ())
  data = FlatClients(x=x, y=np.asarray(y, np.int32), offsets=index[0], counts=index[1],
                     test_offsets=index[2], test_counts=index[3], num_classes=num_classes,
                     classes=size_classes(index[1], index[3]) if index[1].size else (),
                     **validation)
  data.check()
  return jax.device_put(data)


def flat_clients(x, y, parts, x_test, y_test, test_parts, num_classes: int, x_val=None,
                 y_val=None, val_parts=None) -> FlatClients:
  """FlatClients of clients given by index arrays into a dataset's train and test rows.

  The clients are given as `federated.client_datasets` takes them: client i trains on rows
  parts[i] of (x, y) and is tested on rows test_parts[i] of (x_test, y_test). The store
  holds the training rows of every client, then the test rows (copied once), then, given
  x_val, y_val and val_parts, the validation rows (client i's: rows val_parts[i] of
  (x_val, y_val)).

  Args:
    x: the dataset's training inputs [N, ...].
    y: their labels [N] (int).
    parts: n index arrays into x's rows, [m_i] each (client i's training rows).
    x_test: the dataset's test inputs [N_test, ...].
    y_test: their labels [N_test] (int).
    test_parts: n index arrays into x_test's rows, [t_i] each (client i's test rows).
    num_classes: the number of classes C.
    x_val, y_val, val_parts: None (no validation split; the default), or the validation
      rows' inputs [N_val, ...], labels [N_val] and n index arrays into them ([v_i] each).

  Returns:
    FlatClients of the n clients: a store x [S, ...], y [S] of S = sum_i (m_i + t_i + v_i)
    rows, with counts [n] (the m_i), test_counts [n] (the t_i) and val_counts [n] (the v_i;
    None without a validation split).
  """
  lengths = lambda ps: np.array([len(p) for p in ps], np.int64)
  counts, test_counts = lengths(parts), lengths(test_parts)
  concat = lambda ps: np.concatenate([np.asarray(p, np.intp) for p in ps]) if len(ps) else (
      np.zeros(0, np.intp))
  train_rows, test_rows = concat(parts), concat(test_parts)
  xs = [np.asarray(x)[train_rows], np.asarray(x_test)[test_rows]]
  ys = [np.asarray(y)[train_rows], np.asarray(y_test)[test_rows]]
  validation = {}
  if val_parts is not None:
    val_counts, val_rows = lengths(val_parts), concat(val_parts)
    xs.append(np.asarray(x_val)[val_rows])
    ys.append(np.asarray(y_val)[val_rows])
    validation = dict(val_offsets=counts.sum() + test_counts.sum() + np.cumsum(val_counts)
                      - val_counts, val_counts=val_counts)
  offsets = np.cumsum(counts) - counts
  return segments(np.concatenate(xs), np.concatenate(ys), offsets, counts,
                  counts.sum() + np.cumsum(test_counts) - test_counts, test_counts, num_classes,
                  **validation)


def from_padded(data) -> FlatClients:
  """The FlatClients of padded `federated.ClientDatasets` (x [n, m, ...] with counts [n]
  real rows, likewise the test and validation splits): the same clients and samples,
  without the padding."""
  rows = lambda counts, m: [np.arange(i * m, i * m + c) for i, c in enumerate(counts)]

  def split(x, y, counts):  # (x [n m, ...], y [n m], the clients' rows) of a padded split
    x = np.asarray(x)
    return (x.reshape(-1, *x.shape[2:]), np.asarray(y).reshape(-1),
            rows(np.asarray(counts), x.shape[1]))

  validation = () if not data.has_validation else split(data.x_val, data.y_val,
                                                         data.val_counts)
  return flat_clients(*split(data.x, data.y, data.counts),
                      *split(data.x_test, data.y_test, data.test_counts), data.num_classes,
                      *validation)


def laid_out(x: np.ndarray, y: np.ndarray, splits: list, blocks: int):
  """(x [blocks * B, ...], y [blocks * B] (int32), offsets) of a store in `blocks` blocks
  of B rows: block d holds the clients [d n / blocks, (d + 1) n / blocks) (blocks divides
  n), for each split in turn each of its clients' rows, zero-padded to the longest block.
  splits[j][i]: client i's rows of split j (an integer index array into x [N, ...], y [N]);
  offsets[j] [n] (int32): where they start, counted from the block's start."""
  n = len(splits[0])
  held = n // blocks
  parts, starts = [], []
  for d in range(blocks):
    rows = [np.asarray(split[i], np.intp) for split in splits
            for i in range(d * held, (d + 1) * held)]
    lengths = np.array([len(r) for r in rows], np.int64)
    parts.append(np.concatenate(rows))
    starts.append((np.cumsum(lengths) - lengths).reshape(len(splits), held))
  size = max(len(rows) for rows in parts)
  store_x = aligned_empty((blocks * size, *x.shape[1:]), x.dtype)
  store_y = np.zeros(blocks * size, np.int32)
  for d, rows in enumerate(parts):
    store_x[d * size:d * size + len(rows)] = x[rows]
    store_x[d * size + len(rows):(d + 1) * size] = 0  # the block's padding only
    store_y[d * size:d * size + len(rows)] = y[rows]
  offsets = [np.concatenate([s[j] for s in starts]).astype(np.int32)
             for j in range(len(splits))]
  return store_x, store_y, offsets


def for_devices(data: FlatClients, devices: int) -> FlatClients:
  """`data` laid out for a client axis split over `devices` devices (`nn.sharded`): device
  d's clients, [d n / devices, (d + 1) n / devices), have their training then test (then
  validation) rows in block d of the store (blocks zero-padded to the longest), offsets
  counted from the block's start. Raises ValueError unless devices divides n."""
  n = data.num_clients
  if devices < 1 or n % devices:
    raise ValueError(f"for_devices: devices={devices} must divide num_clients={n}")
  names = [("offsets", "counts"), ("test_offsets", "test_counts")]
  if data.has_validation:
    names.append(("val_offsets", "val_counts"))
  splits = [[np.arange(o, o + c) for o, c in zip(np.asarray(getattr(data, offsets)),
                                                 np.asarray(getattr(data, counts)))]
            for offsets, counts in names]
  store_x, store_y, offsets = laid_out(np.asarray(data.x), np.asarray(data.y), splits,
                                       devices)
  return jax.device_put(data.replace(x=store_x, y=store_y, blocks=devices,
                                     **{name: o for (name, _), o in zip(names, offsets)}))


def stack(datasets: list[FlatClients]) -> FlatClients:
  """One FlatClients with a leading run axis over `datasets` (e.g. seeds) of the same n
  clients and blocks, all with a validation split or none: each block of their stores
  zero-padded to the longest, size classes merged (each class's T and share the largest;
  val_classes: each V the largest)."""
  kinds = lambda d: {"clients": d.num_clients, "input shape": tuple(d.x.shape[1:]),
                     "input dtype": np.dtype(d.x.dtype), "num_classes": d.num_classes,
                     "blocks (devices laid out for)": d.blocks,
                     "validation split": d.has_validation}
  for i, d in enumerate(datasets):
    for what, value in kinds(d).items():
      if value != kinds(datasets[0])[what]:
        raise ValueError(f"stack: datasets[{i}] has {what} {value} but datasets[0] has "
                         f"{kinds(datasets[0])[what]}: stack stores of the same clients, "
                         f"input shape and dtype, classes, layout and validation split (e.g. "
                         f"one per seed)")
  blocks = datasets[0].blocks
  rows = max(d.x.shape[0] // blocks for d in datasets)
  merged = {}
  for d in datasets:
    for r, t, share in d.classes:
      held = merged.get(r, (0, 0.0))
      merged[r] = (max(t, held[0]), max(share, held[1]))

  def stacked(name):  # [runs, blocks * rows, ...], aligned: placed without a copy
    first = getattr(datasets[0], name)
    out = aligned_empty((len(datasets), blocks, rows, *first.shape[1:]), first.dtype)
    for run, d in enumerate(datasets):
      a = np.asarray(getattr(d, name)).reshape(blocks, -1, *first.shape[1:])
      out[run, :, :a.shape[1]] = a
      out[run, :, a.shape[1]:] = 0
    return out.reshape(len(datasets), blocks * rows, *first.shape[1:])

  classes = tuple((r, t, share) for r, (t, share) in sorted(merged.items()))
  indices = tree.stack([(d.offsets, d.counts, d.test_offsets, d.test_counts)
                        for d in datasets])
  validation = {}
  if datasets[0].has_validation:
    val_rows = {}
    for d in datasets:
      for r, v in d.val_classes:
        val_rows[r] = max(v, val_rows.get(r, 0))
    val_offsets, val_counts = tree.stack([(d.val_offsets, d.val_counts) for d in datasets])
    validation = dict(val_offsets=val_offsets, val_counts=val_counts,
                      val_classes=tuple(sorted(val_rows.items())))
  return jax.device_put(FlatClients(
      stacked("x"), stacked("y"), *indices, num_classes=datasets[0].num_classes,
      classes=classes, blocks=blocks, **validation))
