"""What a neural algorithm's round costs, from shapes alone (nothing compiled or run).

`communication`: the bytes a sampled client downloads (the shared params and the server
state of `Personalized.server_sent`, e.g. SCAFFOLD's control variate) and uploads (what
`client_update` returns as `sent`), plus what `Personalized.exchanged` says a round moves
outside the hooks (FLUTE's heads, Fed-MTL's cohort sum, L2GD's averaging rounds). Cost an
algorithm itself, not the traced program that several share, which sends every leaf.
`round_flops`: the floating-point operations of the whole round. XLA's cost analysis
counts a loop's body once whatever its trip count, so each loop body's count is added
times its trips (a scan's length, a fori_loop's bound read from the jaxpr; local SGD's
steps at their bound ceil(m / batch_size)), on data padded to the largest client
(`one_run`); a conditional counts its costlier branch, a while loop without a static
bound once.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex

from fedjax_rep.core import checks
from fedjax_rep.data import federated

# Primitives whose single output is an elementwise function of their inputs' values with
# the same upper bound (int scalars: trip counts), and the call-like ones that run their
# one sub-jaxpr once on their inputs.
_SAME_BOUND = ("convert_element_type", "broadcast_in_dim", "reshape", "squeeze",
               "expand_dims", "copy", "copy_p", "reduce_max")
_CALLS = ("jit", "pjit", "closed_call", "core_call", "remat", "checkpoint",
          "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr")


def tree_bytes(tree) -> int:
  """The bytes of the arrays (or shapes) of pytree `tree`: sum of size * itemsize."""
  return sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def one_run(data, hparams):
  """(data, hparams) as shapes (`jax.ShapeDtypeStruct` leaves) of one run: `data`'s leading
  run axes (counts [runs..., n]) and hparams' sweep axis (leaves [runs] or []) dropped;
  ClientDatasets or FlatClients alike become ClientDatasets of n clients of m rows, m the
  largest client's training samples (max counts, where the counts are concrete; else
  `client_spec`'s rows): x [n, m, ...], y [n, m], counts [n] (the test split [n, 1, ...]:
  no round reads it)."""
  counts = data.counts
  runs = len(counts.shape) - 1
  data = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[runs:], a.dtype), data)
  x, y, count = data.client_spec()
  m = max(int(np.max(np.asarray(counts))), 1) if checks.concrete(counts) else x.shape[0]
  n = data.num_clients
  spec = lambda a, *shape: jax.ShapeDtypeStruct((n, *shape), a.dtype)
  padded = federated.ClientDatasets(
      x=spec(x, m, *x.shape[1:]), y=spec(y, m), counts=spec(count),
      x_test=spec(x, 1, *x.shape[1:]), y_test=spec(y, 1), test_counts=spec(count),
      num_classes=data.num_classes)
  hparams = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(jnp.shape(a)[1:], jnp.result_type(a)), hparams)
  return padded, hparams


def _unsharded(algorithm):
  """`algorithm` on one device (the same work, summed over the devices)."""
  return dataclasses.replace(algorithm, devices=None, cohort_groups=None)


def communication(algorithm, data, hparams) -> dict:
  """{"upload_bytes": int, "download_bytes": int} of one sampled client in one round of
  `algorithm` (a `Personalized`) on `data` (ClientDatasets or FlatClients, with or without
  leading run axes) with `hparams`, from shapes (nothing compiles).

  download: the shared params the client receives (`NNState.shared`) and the server state
  it is sent (`server_sent`'s keys of `NNState.server`); upload: what its update returns as
  `sent` (traced through `train_clients` on a cohort of one, so an algorithm that prepares
  `client_update`'s inputs itself is covered); each plus `exchanged`'s (up, down) times the
  share of rounds that exchange them (rounded to whole bytes).
  """
  algorithm = _unsharded(algorithm)
  data, shapes = one_run(data, hparams)
  leaves, structure = jax.tree.flatten(shapes)
  shared, personal, sent, received = _exchanged_shapes(algorithm, data, structure,
                                                       tuple(leaves))
  up, down, share = algorithm.exchanged(shared, personal, hparams)
  return {"upload_bytes": tree_bytes(sent) + round(float(share) * tree_bytes(up)),
          "download_bytes": (tree_bytes(shared) + tree_bytes(received)
                             + round(float(share) * tree_bytes(down)))}


@functools.lru_cache(maxsize=64)
def _exchanged_shapes(algorithm, data, structure, leaves) -> tuple:
  """(shared params, personal params of one client, what a client's update sends, the
  server state a client is sent) of `algorithm` on `data` (`one_run`'s shapes) with hparams
  of `structure` and shapes `leaves`, as shapes: traced once per algorithm and shapes (a
  grid's settings share them)."""
  hparams = jax.tree.unflatten(structure, leaves)
  key = jax.eval_shape(lambda: jax.random.key(0))
  state = jax.eval_shape(algorithm.init, key, data, hparams)
  one = jax.ShapeDtypeStruct((1,), jnp.int32)
  sent = jax.eval_shape(lambda s, k, d, h, c: algorithm.train_clients(
      s, k, d, h, c, c, algorithm.round_info(s, d.num_clients))[1],
                        state, key, data, hparams, one)
  personal = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                          state.personal)
  missing = sorted(set(algorithm.server_sent) - set(state.server))
  if missing:
    raise ValueError(f"{algorithm.name}: server_sent names {missing}, not keys of its server "
                     f"state {sorted(state.server)}")
  return state.shared, personal, sent, {k: state.server[k] for k in algorithm.server_sent}


def round_flops(algorithm, data, hparams) -> float:
  """The floating-point operations of one round of `algorithm` (its `round`: cohort
  sampling, local training of the cohort, the server's update) on `data` (as
  `communication`'s; costed as `one_run`'s, every client the largest one's size) with
  `hparams`: `flops` of the round traced on shapes, every loop body times its trip count
  (the module docstring: minibatch steps at their bound, a conditional's costlier branch).
  Nothing is compiled or run."""
  algorithm = _unsharded(algorithm)
  data, hparams = one_run(data, hparams)
  key = jax.eval_shape(lambda: jax.random.key(0))
  state = jax.eval_shape(algorithm.init, key, data, hparams)
  return flops(lambda s, k, d, h: algorithm.round(s, k, d, h), state, key, data, hparams)


def flops(fn, *args) -> float:
  """XLA's count of floating-point operations of fn(*args) (arrays or
  `jax.ShapeDtypeStruct`s), with loops counted by their trip counts: `Lowered.cost_analysis`
  of the whole program, plus (trips - 1) times each loop body's own count (nested loops
  likewise; the module docstring says how trips are found). Lowers, never compiles."""
  closed = jax.make_jaxpr(fn)(*args)
  return _xla_flops(closed) + _corrections(closed.jaxpr, {})


def _xla_flops(closed) -> float:
  """'flops' of `Lowered.cost_analysis` of a closed jaxpr (a dict, or a list of one dict
  per program in older jax)."""
  specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
  analysis = jax.jit(jex.jaxpr_as_fun(closed)).lower(*specs).cost_analysis()
  if isinstance(analysis, (list, tuple)):
    return float(sum(a.get("flops", 0.0) for a in analysis))
  return float(analysis.get("flops", 0.0))


def _bound(atom, bounds: dict):
  """An upper bound (int) of the values of a jaxpr atom, or None: a literal's value, else
  `bounds`' entry."""
  if isinstance(atom, jex.Literal):
    value = atom.val
    return int(value) if jnp.ndim(value) == 0 and jnp.issubdtype(
        jnp.result_type(value), jnp.integer) else None
  return bounds.get(atom)


def _propagate(eqn, bounds: dict) -> None:
  """Adds to `bounds` what `eqn` bounds of its outputs: min by its smallest bounded input,
  clamp by its upper limit, shape and type changes by their input's bound, a call by its
  sub-jaxpr's."""
  name = eqn.primitive.name
  inputs = [_bound(a, bounds) for a in eqn.invars]
  out = None
  if name == "min":
    known = [b for b in inputs if b is not None]
    out = min(known) if known else None
  elif name == "clamp":
    out = inputs[2]
  elif name in _SAME_BOUND:
    out = inputs[0]
  elif name in _CALLS:
    subs = list(jex.jaxprs_in_params(eqn.params))
    if len(subs) == 1 and len(subs[0].invars) == len(eqn.invars):
      inner = dict(zip(subs[0].invars, inputs))
      _walk_bounds(subs[0], inner)
      for var, sub_out in zip(eqn.outvars, subs[0].outvars):
        if _bound(sub_out, inner) is not None:
          bounds[var] = _bound(sub_out, inner)
    return
  if out is not None and len(eqn.outvars) == 1:
    bounds[eqn.outvars[0]] = out


def _walk_bounds(jaxpr, bounds: dict) -> None:
  """`_propagate` over every equation of `jaxpr` in order."""
  for eqn in jaxpr.eqns:
    _propagate(eqn, bounds)


def _while_trips(eqn, bounds: dict) -> int:
  """The trip count of a while loop: a fori_loop's (its cond `i < upper` of two carries, up
  to shape and type changes), upper's bound less i's start where that is known (else 0);
  1 where there is no such cond or no bound of upper."""
  cond = eqn.params["cond_jaxpr"].jaxpr
  skip = eqn.params["body_nconsts"]  # the eqn's inputs: cond consts, body consts, carries
  source = {v: i for i, v in enumerate(cond.invars) if i >= eqn.params["cond_nconsts"]}
  for inner in cond.eqns:
    if inner.primitive.name in _SAME_BOUND and inner.invars[0] in source:
      source[inner.outvars[0]] = source[inner.invars[0]]
    if inner.primitive.name == "lt" and all(a in source for a in inner.invars):
      counter, limit = (eqn.invars[source[a] + skip] for a in inner.invars)
      upper = _bound(limit, bounds)
      if upper is not None:
        return max(upper - (_bound(counter, bounds) or 0), 0)
  return 1


def _corrections(jaxpr, bounds: dict) -> float:
  """What to add to XLA's count of `jaxpr` (every loop body once) for the true count: for
  each loop, trips * (its body's true count) - its body's XLA count; for a conditional
  holding loops, its costliest branch's true count - the costliest XLA count; calls
  recursed into. `bounds`: upper bounds of int atoms known from outside."""
  bounds = dict(bounds)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    inputs = [_bound(a, bounds) for a in eqn.invars]
    if name == "scan":
      body = eqn.params["jaxpr"]
      consts = dict(zip(body.jaxpr.invars, inputs[:eqn.params["num_consts"]]))
      total += _loop(body, eqn.params["length"], consts)
    elif name == "while":
      body = eqn.params["body_jaxpr"]
      start = eqn.params["cond_nconsts"]
      consts = dict(zip(body.jaxpr.invars, inputs[start:start + eqn.params["body_nconsts"]]))
      total += _loop(body, _while_trips(eqn, bounds), consts)
    elif name == "cond":
      branches = eqn.params["branches"]
      inner = [_corrections(b.jaxpr, dict(zip(b.jaxpr.invars, inputs[1:]))) for b in branches]
      if any(inner):
        xla = [_xla_flops(b) for b in branches]
        total += max(x + c for x, c in zip(xla, inner)) - max(xla)
    else:
      for sub in jex.jaxprs_in_params(eqn.params):
        total += _corrections(sub, dict(zip(sub.invars, inputs))
                              if len(sub.invars) == len(inputs) else {})
    _propagate(eqn, bounds)
  return total


def _loop(body, trips: int, consts: dict) -> float:
  """The correction of a loop of `trips` trips of `body` (a closed jaxpr; `consts`: bounds
  of its inputs): trips * (XLA count + corrections of the body) - the XLA count once."""
  inner = _corrections(body.jaxpr, consts)
  if trips == 1:
    return inner
  return (trips - 1) * _xla_flops(body) + trips * inner
