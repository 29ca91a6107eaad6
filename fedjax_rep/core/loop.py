"""The round loop: rounds under `lax.scan` inside `jit`, driven from Python in chunks.

An algorithm is a hashable (frozen dataclass) object with two pure methods:

  init(key, data, hparams) -> state
  round(state, key, data, hparams) -> (state, metrics)   # metrics: dict of scalars

Its fields are structure (sizes, step counts: static, part of the compiled program);
`hparams` are traced numbers, so a sweep over them is a `vmap`, not a recompile.
The key of round t is `fold_in(rounds_key, t)`, so the numbers do not depend on how
the rounds are split into chunks, and a run can be resumed from any round.
"""

import dataclasses
import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

DEFAULT_CHUNK = 50


@dataclasses.dataclass
class RunResult:
  """The outcome of `run`: final state, per-round metrics ([rounds] or [sweep, rounds]) and
  the wall time of the rounds (initialisation and host copies of the state excluded)."""
  state: Any
  metrics: dict[str, np.ndarray]
  seconds: float


def split_run_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(init_key, rounds_key) of a run's key; round t uses fold_in(rounds_key, t)."""
  init_key, rounds_key = jax.random.split(key)
  return init_key, rounds_key


def all_finite(tree) -> jax.Array:
  """True when every floating-point entry of `tree` is finite."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def _scan_rounds(algorithm, state, diverged, data, hparams, rounds_key, start, num_rounds,
                 chunk):
  """`chunk` rounds from round `start`; returns ((state, diverged), metrics [chunk]).

  Rounds at or past `num_rounds`, and every round of a diverged run, leave the state as is
  and report NaN metrics. A round whose new state or metrics are not finite diverges: the
  state keeps its last finite value and `diverged` (also a metric, 0/1 per round) stays 1
  from then on.
  """

  def step(carry, t):
    state, _ = carry
    new_state, metrics = algorithm.round(state, jax.random.fold_in(rounds_key, t), data,
                                         hparams)
    finite = all_finite((new_state, metrics))
    state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
    metrics = jax.tree.map(lambda m: jnp.where(finite, m, jnp.nan), metrics)
    return (state, ~finite), {**metrics, "diverged": (~finite).astype(jnp.float32)}

  def skip(carry, t):
    shapes = jax.eval_shape(step, carry, t)[1]
    metrics = jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)
    return carry, {**metrics, "diverged": carry[1].astype(jnp.float32)}

  def body(carry, t):
    return jax.lax.cond((t < num_rounds) & ~carry[1], step, skip, carry, t)

  return jax.lax.scan(body, (state, diverged), start + jnp.arange(chunk))


@functools.partial(jax.jit, static_argnames=("algorithm", "chunk", "sweep_axes"))
def _run_chunk(algorithm, state, diverged, data, hparams, rounds_key, start, num_rounds, *,
               chunk, sweep_axes):
  scan = functools.partial(_scan_rounds, algorithm, chunk=chunk)
  if sweep_axes is not None:
    scan = jax.vmap(scan, in_axes=(0, 0, *sweep_axes, None, None))
  return scan(state, diverged, data, hparams, rounds_key, start, num_rounds)


@functools.partial(jax.jit, static_argnames=("algorithm", "sweep_axes"))
def _init(algorithm, key, data, hparams, *, sweep_axes):
  init = algorithm.init
  if sweep_axes is not None:
    data_axis, hparams_axis, key_axis = sweep_axes
    init = jax.vmap(init, in_axes=(key_axis, data_axis, hparams_axis))
  return init(key, data, hparams)


def init_state(algorithm, data, hparams, key, *, sweep_axes=None):
  """The algorithm's initial state from the run key (jitted; vmapped when sweeping)."""
  init_key = _split_keys(key, sweep_axes)[0]
  return _init(algorithm, init_key, data, hparams, sweep_axes=sweep_axes)


def _split_keys(key, sweep_axes):
  if sweep_axes is not None and sweep_axes[2] == 0:
    return jax.vmap(split_run_key)(key)
  return split_run_key(key)


def run(algorithm, data, hparams, key, num_rounds: int, *, state=None, start_round: int = 0,
        chunk: int | None = None, sweep_axes: tuple | None = None, progress: bool = True,
        desc: str | None = None) -> RunResult:
  """Runs rounds [start_round, num_rounds) of `algorithm` and returns state and metrics.

  Args:
    algorithm: hashable algorithm object (see module docstring).
    data, hparams: pytrees passed to every round (traced).
    key: the run's key; every key in the run is derived from it.
    num_rounds: total rounds of the run (>= 1).
    state: state to continue from (resume); default: `algorithm.init`.
    start_round: index of the first round to run (resume).
    chunk: rounds per compiled scan; one compilation serves every chunk.
    sweep_axes: `in_axes` of (data, hparams, key) to vmap the whole run over a leading
      sweep axis (seeds, step sizes); None for a single run.
    progress: show a progress bar (rounds done / total, rounds per second).
  Returns:
    RunResult with metrics[name] of shape [rounds] ([sweep, rounds] when sweeping), where
    rounds = num_rounds - start_round. A run whose state (or a metric) becomes non-finite stops there
    (the state keeps its last finite value; the rest of a sweep goes on): from that round
    on metrics["diverged"] is 1 and the other metrics are NaN.
  """
  if num_rounds < 1:
    raise ValueError(f"num_rounds must be an integer >= 1, got {num_rounds!r}")
  if not 0 <= start_round < num_rounds:
    raise ValueError(f"start_round must be in [0, num_rounds={num_rounds}), got {start_round!r}")
  if state is None:
    state = init_state(algorithm, data, hparams, key, sweep_axes=sweep_axes)
  state = jax.block_until_ready(state)
  rounds_key = _split_keys(key, sweep_axes)[1]
  sweep_shape = () if sweep_axes is None else jax.tree.leaves(state)[0].shape[:1]
  diverged = jnp.zeros(sweep_shape, bool)
  todo = num_rounds - start_round
  chunk = min(chunk or DEFAULT_CHUNK, todo)
  pieces = []
  start_time = time.perf_counter()
  bar = tqdm(total=todo, unit="round", disable=not progress, desc=desc or algorithm.name,
             leave=False)
  for _ in range(math.ceil(todo / chunk)):
    start = start_round + len(pieces) * chunk
    (state, diverged), metrics = _run_chunk(
        algorithm, state, diverged, data, hparams, rounds_key, jnp.asarray(start),
        jnp.asarray(num_rounds), chunk=chunk, sweep_axes=sweep_axes)
    pieces.append(jax.device_get(metrics))
    bar.update(min(chunk, num_rounds - start))
  bar.close()
  jax.block_until_ready(state)
  axis = 0 if sweep_axes is None else 1
  metrics = {name: np.concatenate([p[name] for p in pieces], axis=axis) for name in pieces[0]}
  metrics = {name: np.take(v, np.arange(todo), axis=axis) for name, v in metrics.items()}
  return RunResult(state=state, metrics=metrics, seconds=time.perf_counter() - start_time)
