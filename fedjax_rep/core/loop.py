"""The round loop: rounds under `lax.scan` inside `jit`, driven from Python in chunks.

An algorithm follows `core.protocols.Algorithm`:

  init(key, data, hparams) -> state
  round(state, key, data, hparams) -> (state, metrics)   # metrics: dict of scalars
  evaluate(state, data, hparams) -> metrics               # optional (`Evaluated`)

Its fields are structure (sizes, step counts: static, part of the compiled program);
`hparams` are traced numbers, so a sweep over them is a `vmap`, not a recompile.
The key of round t is `fold_in(rounds_key, t)`, so the numbers do not depend on how
the rounds are split into chunks, and a run can be resumed from any round.
Chunk boundaries fall on multiples of `chunk` and of `eval_every`; `evaluate` runs at
those of `eval_every` and after the last round. The carried state is donated between
chunks (a state passed in by the caller is copied first, so it stays valid).
"""

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from optax import tree_utils as otu
from tqdm import tqdm

from fedjax_rep.core.protocols import Evaluated

DEFAULT_CHUNK = 50


@dataclasses.dataclass
class RunResult:
  """The outcome of `run`.

  state: the final state; metrics[name]: per-round metrics [rounds] ([sweep, rounds] when
  sweeping); seconds: wall time of the rounds and evaluations (initialisation excluded);
  diverged: bool [] ([sweep]), to pass back with `state` when resuming;
  eval_rounds [E]: the rounds (1-based) after which `evaluate` ran, and eval_metrics[name]
  its metrics [E] ([sweep, E]); empty for algorithms without `evaluate`.
  """
  state: Any
  metrics: dict[str, np.ndarray]
  seconds: float
  diverged: Any = None
  eval_rounds: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, int))
  eval_metrics: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def split_run_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(init_key, rounds_key) of a run's key; round t uses fold_in(rounds_key, t)."""
  init_key, rounds_key = jax.random.split(key)
  return init_key, rounds_key


def all_finite(tree) -> jax.Array:
  """True when every floating-point entry of `tree` is finite."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def _scan_rounds(algorithm, state, diverged, data, hparams, rounds_key, start, stop, chunk):
  """`chunk` rounds from round `start`; returns ((state, diverged), metrics [chunk]).

  Rounds at or past `stop`, and every round of a diverged run, leave the state as is
  and report NaN metrics. A round whose new state or metrics are not finite diverges: the
  state keeps its last finite value and `diverged` (also a metric, 0/1 per round) stays 1
  from then on.
  """

  def step(carry, t):
    state, _ = carry
    new_state, metrics = algorithm.round(state, jax.random.fold_in(rounds_key, t), data,
                                         hparams)
    finite = all_finite((new_state, metrics))
    state = otu.tree_where(finite, new_state, state)
    metrics = jax.tree.map(lambda m: jnp.where(finite, m, jnp.nan), metrics)
    return (state, ~finite), {**metrics, "diverged": (~finite).astype(jnp.float32)}

  def skip(carry, t):
    shapes = jax.eval_shape(step, carry, t)[1]
    metrics = jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)
    return carry, {**metrics, "diverged": carry[1].astype(jnp.float32)}

  def body(carry, t):
    return jax.lax.cond((t < stop) & ~carry[1], step, skip, carry, t)

  return jax.lax.scan(body, (state, diverged), start + jnp.arange(chunk))


@functools.partial(jax.jit, static_argnames=("algorithm", "chunk", "sweep_axes"),
                   donate_argnames=("state", "diverged"))
def _run_chunk(algorithm, state, diverged, data, hparams, key, start, stop, *,
               chunk, sweep_axes):
  rounds_key = _split_keys(key, sweep_axes)[1]
  scan = functools.partial(_scan_rounds, algorithm, chunk=chunk)
  if sweep_axes is not None:
    scan = jax.vmap(scan, in_axes=(0, 0, *sweep_axes, None, None))
  return scan(state, diverged, data, hparams, rounds_key, start, stop)


@functools.partial(jax.jit, static_argnames=("algorithm", "sweep_axes"))
def _init(algorithm, key, data, hparams, *, sweep_axes):
  key = _split_keys(key, sweep_axes)[0]
  init = algorithm.init
  if sweep_axes is not None:
    data_axis, hparams_axis, key_axis = sweep_axes
    init = jax.vmap(init, in_axes=(key_axis, data_axis, hparams_axis))
  return init(key, data, hparams)


@functools.partial(jax.jit, static_argnames=("algorithm", "sweep_axes"))
def _evaluate(algorithm, state, data, hparams, *, sweep_axes):
  evaluate = algorithm.evaluate
  if sweep_axes is not None:
    evaluate = jax.vmap(evaluate, in_axes=(0, *sweep_axes[:2]))
  return evaluate(state, data, hparams)


def init_state(algorithm, data, hparams, key, *, sweep_axes=None):
  """The algorithm's initial state from the run key (jitted; vmapped when sweeping)."""
  return _init(algorithm, key, data, hparams, sweep_axes=sweep_axes)


def evaluate(algorithm, state, data, hparams, *, sweep_axes=None):
  """`algorithm.evaluate` of `state` (jitted; vmapped when sweeping)."""
  return _evaluate(algorithm, state, data, hparams, sweep_axes=sweep_axes)


def _split_keys(key, sweep_axes):
  if sweep_axes is not None and sweep_axes[2] == 0:
    return jax.vmap(split_run_key)(key)
  return split_run_key(key)


def _placed_like(value, state):
  """`value` replicated over the mesh of a state sharded over devices (as the chunks return
  it, so that the second chunk does not compile again); as is for a state on one device."""
  for leaf in jax.tree.leaves(state):
    if isinstance(leaf.sharding, NamedSharding):
      return jax.device_put(value, NamedSharding(leaf.sharding.mesh, PartitionSpec()))
  return value


def _next_boundary(t: int, num_rounds: int, *periods: int) -> int:
  """The first multiple of any of `periods` after round t, capped at num_rounds."""
  return min([num_rounds] + [(t // p + 1) * p for p in periods])


def run(algorithm, data, hparams, key, num_rounds: int, *, state=None, start_round: int = 0,
        diverged=None, chunk: int | None = None, eval_every: int | None = None,
        sweep_axes: tuple | None = None, progress: bool = True,
        desc: str | None = None) -> RunResult:
  """Runs rounds [start_round, num_rounds) of `algorithm` and returns state and metrics.

  Args:
    algorithm: hashable algorithm object (see module docstring).
    data, hparams: pytrees passed to every round (traced).
    key: the run's key; every key in the run is derived from it.
    num_rounds: total rounds of the run (>= 1).
    state: state to continue from (resume); default: `algorithm.init`.
    start_round: index of the first round to run (resume).
    diverged: the `diverged` flags of the run being resumed (RunResult.diverged); default
      none diverged.
    chunk: rounds per compiled scan; one compilation serves every chunk.
    eval_every: for algorithms with `evaluate`: evaluate after every `eval_every` rounds
      (and after the last); None: after the last round only.
    sweep_axes: `in_axes` of (data, hparams, key) to vmap the whole run over a leading
      sweep axis (seeds, step sizes); None for a single run.
    progress: show a progress bar (rounds done / total, rounds per second).
  Returns:
    RunResult with metrics[name] of shape [rounds] ([sweep, rounds] when sweeping), where
    rounds = num_rounds - start_round. A run whose state (or a metric) becomes non-finite
    stops there (the state keeps its last finite value; the rest of a sweep goes on): from
    that round on metrics["diverged"] is 1 and the other metrics are NaN.
  """
  if isinstance(num_rounds, bool) or not isinstance(num_rounds, (int, np.integer)) \
      or num_rounds < 1:
    raise ValueError(f"num_rounds must be an integer >= 1, got {num_rounds!r}")
  if not 0 <= start_round < num_rounds:
    raise ValueError(f"start_round must be in [0, num_rounds={num_rounds}), got {start_round!r}")
  for name, value in (("chunk", chunk), ("eval_every", eval_every)):
    if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
      raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
  if state is None:
    state = init_state(algorithm, data, hparams, key, sweep_axes=sweep_axes)
  else:  # the chunks donate the state they carry: keep the caller's arrays valid
    state = jax.tree.map(jnp.copy, state)
  state = jax.block_until_ready(state)
  sweep_shape = () if sweep_axes is None else jax.tree.leaves(state)[0].shape[:1]
  diverged = _placed_like(
      np.zeros(sweep_shape, bool) if diverged is None else np.array(diverged, bool), state)
  axis = 0 if sweep_axes is None else 1  # the rounds axis of the metrics
  evaluated = isinstance(algorithm, Evaluated)
  periods = [eval_every] if evaluated and eval_every else []
  todo = num_rounds - start_round
  chunk = min(chunk or eval_every or DEFAULT_CHUNK, todo)
  pieces, eval_rounds, eval_pieces = [], [], []
  start_time = time.perf_counter()
  bar = tqdm(total=todo, unit="round", disable=not progress, desc=desc or algorithm.name,
             leave=False)
  t = start_round
  while t < num_rounds:
    stop = _next_boundary(t, num_rounds, chunk, *periods)
    (state, diverged), metrics = _run_chunk(
        algorithm, state, diverged, data, hparams, key, jnp.asarray(t),
        jnp.asarray(stop), chunk=chunk, sweep_axes=sweep_axes)
    metrics = jax.device_get(metrics)
    pieces.append({k: np.take(v, np.arange(stop - t), axis=axis) for k, v in metrics.items()})
    if evaluated and (stop == num_rounds or (eval_every and stop % eval_every == 0)):
      eval_rounds.append(stop)
      eval_pieces.append(jax.device_get(evaluate(algorithm, state, data, hparams,
                                                 sweep_axes=sweep_axes)))
    bar.update(stop - t)
    t = stop
  bar.close()
  jax.block_until_ready(state)
  metrics = {name: np.concatenate([p[name] for p in pieces], axis=axis) for name in pieces[0]}
  eval_metrics = {name: np.stack([np.asarray(p[name]) for p in eval_pieces], axis=axis)
                  for name in (eval_pieces[0] if eval_pieces else {})}
  return RunResult(state=state, metrics=metrics, seconds=time.perf_counter() - start_time,
                   diverged=diverged, eval_rounds=np.array(eval_rounds, int),
                   eval_metrics=eval_metrics)
