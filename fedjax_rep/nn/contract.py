"""The checks of a neural run before anything compiles: the data, the structure, the
hparams' options, and the hooks of the algorithm (a user's subclass included), each
mistake a one-line ValueError naming the hook and what it must return.

The hooks are probed by `jax.eval_shape` (traced on shapes, never compiled) on one
client: `labels` must label every parameter of the model 'shared' or 'personal';
`client_update` must return (sent, personal params shaped as it got them, a scalar
loss); `server_update` must return (shared params and server state, each shaped as it got
them).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import checks
from fedjax_rep.core.protocols import ClassificationData
from fedjax_rep.nn import conventions
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import params as params_lib

# Whom `evaluate` tests: every client (FedRep's code, the default), or the last round's cohort.
EVAL_CLIENTS = ("all", "cohort")
AVERAGE_UNTRAINED = conventions.FLAG_OF["starting_heads"]
_PROBED = set()  # (algorithm, shapes) whose hooks passed `check_hooks`


def check(algorithm, data, hparams) -> None:
  """Raises ValueError on a run `algorithm` cannot make: hparams' options
  (`check_options`), data that are no `core.protocols.ClassificationData`, the data's own
  checks (labels below the classes the model outputs too: its num_classes), 1 <= cohort <=
  num_clients, eval_clients one of EVAL_CLIENTS and the hooks (`check_hooks`)."""
  check_options(algorithm, hparams)
  if not isinstance(data, ClassificationData):
    raise ValueError(f"{algorithm.name}: the neural algorithms train on classification data "
                     f"(fr.ClientDatasets, fr.FlatClients: fr.client_datasets, "
                     f"fr.flat_clients), not a {type(data).__name__}")
  data.check(min(data.num_classes, algorithm.model.num_classes))
  checks.in_range("cohort", algorithm.cohort, 1, data.num_clients, "the number of clients",
                  "sample at most that many clients per round")
  if algorithm.eval_clients not in EVAL_CLIENTS:
    raise ValueError(f"eval_clients={algorithm.eval_clients!r} must be one of "
                     f"{EVAL_CLIENTS}: evaluate every client or the last round's cohort")
  check_hooks(algorithm, data, hparams)


def check_options(algorithm, hparams) -> None:
  """Raises ValueError on an option of hparams that `algorithm` does not declare
  (`hparams.declared`) or a concrete value out of its range (every value of a sweep)."""
  declared = hparams_lib.declared(algorithm)
  if AVERAGE_UNTRAINED in hparams.options and AVERAGE_UNTRAINED not in declared:
    raise ValueError(f"{algorithm.name}: the option {AVERAGE_UNTRAINED} (starting_heads="
                     f"averaged) applies to FedRep, FedPer, LG-FedAvg and FLUTE, whose "
                     f"authors' code has it; leave it out for {algorithm.name}")
  for name, value in hparams.options.items():
    if name not in declared:
      raise ValueError(f"{algorithm.name} takes no option {name!r}; its options: "
                       f"{', '.join(sorted(declared))}")
    if checks.concrete(value):
      for v in np.ravel(np.asarray(value)):
        declared[name].check(v.item())


def _mismatch(got, want) -> str | None:
  """How pytree `got` differs from `want` (structure, then a leaf's shape or dtype), or None."""
  if jax.tree.structure(got) != jax.tree.structure(want):
    return f"a pytree of structure {jax.tree.structure(got)}, not {jax.tree.structure(want)}"
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    if (g.shape, g.dtype) != (w.shape, w.dtype):
      return (f"{jax.tree_util.keystr(path)} of shape {g.shape} {g.dtype}, not "
              f"{w.shape} {w.dtype}")
  return None


def _probe(algorithm, hook: str, fn, *args, shapes: bool = True):
  """jax.eval_shape(fn, *args) (shapes=False: fn(*args)), an exception in it a one-line
  ValueError naming the hook."""
  try:
    return jax.eval_shape(fn, *args) if shapes else fn(*args)
  except Exception as error:  # a user's hook may raise anything: name it, in one line
    text = " ".join(str(error).split())[:300]
    raise ValueError(f"{algorithm.name}: {hook} failed on the model's shapes: "
                     f"{type(error).__name__}: {text}") from error


def check_hooks(algorithm, data, hparams) -> None:
  """Raises ValueError where a hook of `algorithm` returns what the round cannot use (see
  the module docstring), probed on one client of `data` (shapes only). An algorithm that
  overrides `train_clients` prepares client_update's inputs itself: only its labels and
  init are probed."""
  alone = dataclasses.replace(algorithm, devices=None, cohort_groups=None)
  per_run = lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype)  # a sweep's axis dropped
  hp = jax.tree.map(per_run, hparams)
  client = data.client_spec()
  key = (alone, tuple((a.shape, a.dtype) for a in client), jax.tree.structure(hp))
  if key in _PROBED:
    return
  spec = data.input_spec()
  sample = jax.ShapeDtypeStruct((1, *spec.shape), spec.dtype)
  flat = params_lib.flatten(jax.eval_shape(
      lambda x: algorithm.model.init(jax.random.key(0), x), sample)["params"])
  labels = _probe(alone, "labels", alone.labels, flat, shapes=False)
  if not isinstance(labels, dict) or set(labels) != set(flat) or not set(
      labels.values()) <= {params_lib.SHARED, params_lib.PERSONAL}:
    unknown = sorted(set(labels) - set(flat)) if isinstance(labels, dict) else []
    raise ValueError(f"{alone.name}: labels must return {{path: 'shared' or 'personal'}} for "
                     f"exactly the model's params {sorted(flat)}; "
                     + (f"got unknown paths {unknown}" if unknown else f"got {labels!r}"[:300]))
  state = _probe(alone, "init (initial_parts, initial_server)",
                 lambda: alone.init(jax.random.key(0), data, hp))
  if alone.overrides("train_clients"):
    _PROBED.add(key)
    return
  personal = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), state.personal)
  info = alone.round_info(state, data.num_clients)
  out = _probe(alone, "client_update", lambda s, p, x, y, c, h, i: alone.client_update(
      s, p, x, y, c, jax.random.key(0), h, i), state.shared, personal, *client, hp, info)
  if not (isinstance(out, tuple) and len(out) == 3):
    raise ValueError(f"{alone.name}: client_update must return a tuple (sent, personal, "
                     f"loss), got {type(out).__name__}")
  sent, new_personal, loss = out
  problem = _mismatch(new_personal, personal) or (
      None if loss.shape == () else f"a loss of shape {loss.shape}")
  if problem:
    raise ValueError(f"{alone.name}: client_update must return the client's personal params "
                     f"shaped as it got them and a scalar loss []; got {problem}")
  cohort = 2
  stacked = jax.tree.map(lambda a: jax.ShapeDtypeStruct((cohort, *a.shape), a.dtype), sent)
  out = _probe(alone, "server_update", alone.server_update, state.shared, stacked,
               jax.ShapeDtypeStruct((cohort,), jnp.float32), hp, info)
  if not (isinstance(out, tuple) and len(out) == 2):
    raise ValueError(f"{alone.name}: server_update must return a tuple (shared params, "
                     f"server state), got {type(out).__name__}")
  for what, got, want in (("shared params", out[0], state.shared),
                          ("server state", out[1], state.server)):
    problem = _mismatch(got, want)
    if problem:
      raise ValueError(f"{alone.name}: server_update must return the {what} with the "
                       f"structure and shapes it got (they are carried across rounds); "
                       f"got {problem}")
  _PROBED.add(key)
