"""Checks of a run's inputs, before anything is traced or compiled.

`loop.run` and `loop.init_state` call `check_run` first. It checks what every algorithm
needs (finite hparams; a given state finite and shaped like the algorithm's initial state)
and calls the algorithm's own `check(data, hparams)` (`core.protocols.Checked`) on the data
of every run of a sweep. The checks are numpy on concrete arrays; arrays traced inside a
user's own `jit` (or spread over other hosts) stand in as `jax.ShapeDtypeStruct`s, so only
their shapes are checked. Arrays on an accelerator stay there: the checks' reductions run
on the device and bring back only their results (a GPU's dataset copied to the host would
double its memory), and only an input at fault is copied, to name the entry. An input
that cannot run raises a one-line ValueError that names the argument (and the client and
sample where one is at fault), the allowed range and what to do; one that runs but means
little warns (`warn`).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core.protocols import Checked

FLOAT32_MAX = float(np.finfo(np.float32).max)


def sweep_levels(sweep_axes) -> tuple:
  """The vmap levels of `loop.run`'s `sweep_axes`, outermost first, each the `in_axes` of
  (data, hparams, key): () for None, (sweep_axes,) for one such triple, the triples of a
  list of them (nested sweeps: e.g. settings over runs with the data held once,
  [(None, 0, None), (0, None, 0)])."""
  if sweep_axes is None:
    return ()
  return tuple(sweep_axes) if isinstance(sweep_axes, list) else (sweep_axes,)


def check_run(algorithm, data, hparams, key, state=None, sweep_axes=None) -> None:
  """Raises ValueError on inputs of `loop.run` / `loop.init_state` that cannot run, and warns
  on ones that run but mean little, without compiling anything (see the module docstring).
  With a sweep, `algorithm.check` sees each run's data in turn (and the whole hparams);
  `sweep_axes` is one (data, hparams, key) triple of `in_axes` or a list of them (nested
  sweeps, `sweep_levels`)."""
  levels = sweep_levels(sweep_axes)
  data_axis = 0 if any(axes[0] == 0 for axes in levels) else None
  data, hparams = host(data), host(hparams)
  for path, leaf in jax.tree_util.tree_leaves_with_path(hparams):
    finite(f"hparams{jax.tree_util.keystr(path)}", leaf,
           advice="step sizes and weights must be finite numbers")
  if isinstance(algorithm, Checked):
    runs = sweep_runs(_flat_runs(data, sum(axes[0] == 0 for axes in levels)), data_axis)
    for index, run_data in enumerate(runs):
      try:
        algorithm.check(run_data, hparams)
      except ValueError as error:
        if data_axis is None:
          raise
        raise type(error)(f"run {index} of the sweep: {error}") from None
  if state is not None:
    check_state(algorithm, data, hparams, key, host(state), sweep_axes)


def check_state(algorithm, data, hparams, key, state, sweep_axes) -> None:
  """Raises ValueError unless `state` (numpy leaves where concrete) has finite values and the
  leaves and shapes of the algorithm's initial state for these inputs (`jax.eval_shape` of
  its init: traced, not compiled; unchecked where the init cannot run on these data, e.g.
  the method of moments on population losses)."""
  given = dict(jax.tree_util.tree_leaves_with_path(state))
  for path, leaf in given.items():
    finite(f"state{jax.tree_util.keystr(path)}", leaf,
           advice="a run from it diverges at once; pass finite values")
  init = algorithm.init
  for data_axis, hparams_axis, key_axis in reversed(sweep_levels(sweep_axes)):
    init = jax.vmap(init, in_axes=(key_axis, data_axis, hparams_axis))
  try:
    initial = jax.eval_shape(init, key, data, hparams)
  except Exception:  # an init that cannot run on these data: no shapes to compare with
    return
  expected = dict(jax.tree_util.tree_leaves_with_path(initial))
  advice = "pass a state shaped like fr.init_state(algorithm, data, hparams, key)"
  if given.keys() != expected.keys():
    names = lambda paths: ", ".join(sorted(jax.tree_util.keystr(p) for p in paths)) or "none"
    raise ValueError(f"state does not have the leaves of {algorithm.name}'s initial state for "
                     f"these data (missing: {names(expected.keys() - given.keys())}; extra: "
                     f"{names(given.keys() - expected.keys())}); {advice}")
  for path, leaf in given.items():
    if tuple(leaf.shape) != tuple(expected[path].shape):
      raise ValueError(f"state{jax.tree_util.keystr(path)} has shape {tuple(leaf.shape)}, but "
                       f"{algorithm.name} on these data starts from shape "
                       f"{tuple(expected[path].shape)}; {advice}")


def on_accelerator(leaf) -> bool:
  """True for a concrete jax array on an accelerator (any device not the CPU)."""
  return isinstance(leaf, jax.Array) and any(d.platform != "cpu" for d in leaf.devices())


def host(tree):
  """`tree` with its concrete arrays as numpy arrays, and as `jax.ShapeDtypeStruct` (shapes
  only) those that are traced or not all on this host; PRNG keys and arrays on an
  accelerator (`on_accelerator`: checked there) stay as they are."""

  def one(leaf):
    if isinstance(leaf, jax.core.Tracer) or not getattr(leaf, "is_fully_addressable", True):
      return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    if isinstance(leaf, jax.Array) and (
        jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) or on_accelerator(leaf)):
      return leaf
    return np.asarray(leaf)

  return jax.tree.map(one, tree)


def sweep_runs(tree, axis) -> list:
  """The runs of `tree` (leaves from `host`) along its leading sweep axis (`axis` 0), or
  [tree] (`axis` None). Shape-only trees give their first run: every run has its shape."""
  if axis is None:
    return [tree]
  leaves = jax.tree.leaves(tree)
  runs = leaves[0].shape[0] if leaves else 1
  if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in leaves):
    runs = min(runs, 1)

  def run(leaf, index):
    if isinstance(leaf, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype)
    return leaf[index, ...]  # an array, also where the run's leaf is a scalar

  return [jax.tree.map(lambda leaf: run(leaf, index), tree) for index in range(runs)]


def _flat_runs(tree, depth: int):
  """`tree` (leaves from `host`) with its `depth` leading sweep axes as one (as is for a
  depth of 0 or 1)."""
  if depth < 2:
    return tree

  def flat(leaf):
    shape = (int(np.prod(leaf.shape[:depth])), *leaf.shape[depth:])
    if isinstance(leaf, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(shape, leaf.dtype)
    return leaf.reshape(shape)

  return jax.tree.map(flat, tree)


def concrete(*arrays) -> bool:
  """True when every array has values to check: a numpy array or a jax array left on its
  accelerator by `host`, not a shape stand-in or a tracer."""
  return all(isinstance(a, np.ndarray) or (isinstance(a, jax.Array)
                                           and not isinstance(a, jax.core.Tracer))
             for a in arrays)


def in_range(name: str, value, low, high=None, what: str = "", advice: str = "") -> None:
  """Raises ValueError unless low <= value <= high (no upper bound where high is None);
  `what` says what high is, `advice` what to do."""
  if low <= value and (high is None or value <= high):
    return
  bound = f">= {low}" if high is None else f"in [{low}, {high}]"
  what = f" ({high} = {what})" if what else ""
  raise ValueError(f"{name} = {value} is out of range: it must be {bound}{what}; {advice}")


def positive_ints(owner: str, low: int = 1, **values) -> None:
  """Raises ValueError unless every value is an integer >= low (structure checked at
  construction, e.g. rep_dim and cohort; sizes that may be 0 with low=0)."""
  for name, value in values.items():
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
      raise ValueError(f"{owner}: {name} must be an integer >= {low}, got {value!r}")


def finite(name: str, array, axes: tuple = (), advice: str = "drop or impute it") -> None:
  """Raises ValueError naming the first non-finite entry of a floating-point `array` (`axes`
  names its leading axes, e.g. ("client", "sample")); anything else passes. A jax array on
  its accelerator is reduced there per row (entry of its leading axis), and only the first
  faulty row is copied to the host."""
  if not concrete(array) or not jax.dtypes.issubdtype(array.dtype, np.inexact):
    return
  if isinstance(array, jax.Array) and array.ndim:
    rows = np.asarray(_finite_rows(array))
    if rows.all():
      return
    row = int(np.argmin(rows))
    within = np.asarray(array[row])
    index = (row, *_first_nonfinite(within))
    value = within[index[1:]]
  else:
    array = np.asarray(array)
    if np.isfinite(array).all():
      return
    index = _first_nonfinite(array)
    value = array[index]
  entry = f"{name}[{', '.join(map(str, index))}]" if index else name
  where = ", ".join(f"{axis} {i}" for axis, i in zip(axes, index))
  raise ValueError(f"{entry} = {value}{f' ({where})' if where else ''} is not finite: "
                   f"{advice}")


def _first_nonfinite(array: np.ndarray) -> tuple:
  """The index of the first non-finite entry of a numpy `array` that has one."""
  return np.unravel_index(np.argmax(~np.isfinite(array)), array.shape)


@jax.jit
def _finite_rows(array: jax.Array) -> jax.Array:
  """[rows] bool: whether each entry of `array`'s leading axis is all finite (one fused pass
  on the array's device, no temporary of its size)."""
  return jnp.isfinite(array.reshape(array.shape[0], -1)).all(axis=1)


def any_nonzero(array, axis: tuple):
  """array.any(axis) as numpy: on the host for a numpy array, as one jitted (fused) pass on
  its device for a jax array left on an accelerator by `host`."""
  if isinstance(array, jax.Array):
    return np.asarray(_any(array, axis=axis))
  return array.any(axis=axis)


_any = jax.jit(jnp.any, static_argnames="axis")


def clients_text(clients) -> str:
  """'clients 3, 5, 8' (the first five, then '...') of client indices."""
  shown = ", ".join(str(int(i)) for i in clients[:5])
  return f"client{'s' if len(clients) > 1 else ''} {shown}{', ...' if len(clients) > 5 else ''}"


def warn(message: str) -> None:
  """A one-line warning about an input that runs but means little."""
  warnings.warn(message, UserWarning, stacklevel=2)
