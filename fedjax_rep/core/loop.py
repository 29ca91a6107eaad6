"""The round loop: rounds under `lax.scan` inside `jit`, driven from Python in chunks.

An algorithm (`core.protocols.Algorithm`: init, round, optionally evaluate,
quick_compile, tracked_metric) has fields of static structure and traced `hparams`. Round
t's key is `fold_in(rounds_key, t)`, whatever the chunks, so a run resumes from any
round. Chunks end at multiples of `chunk` and of `eval_every`; `evaluate` runs at the
latter and after the last round; the state is donated between chunks (a caller's is
copied first); callbacks get each chunk's metrics (`Chunk`). A run diverges at the first
round whose state or metrics are not finite, or whose tracked metric (else train_loss)
exceeds `blowup` times its magnitude at the first round (the reference, carried like the
state); it keeps its state from before that round, and its metrics and later evaluations
are NaN. On the CPU the programs of a `quick_compile` algorithm, and those
`jit_by_algorithm` jits, compile with `QUICK_COMPILE` (LLVM -O1, XLA:CPU's older fusion
emitters; docs/neural.md); the rest get XLA's defaults.
"""

import dataclasses
import functools
import hashlib
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from tqdm import tqdm

from fedjax_rep.core import checkpoint
from fedjax_rep.core import checks
from fedjax_rep.core import distributed
from fedjax_rep.core.protocols import Evaluated

DEFAULT_CHUNK = 50
# The default blow-up factor. Measured on the recipes (--quick): runs that converge keep
# their train_loss below 8 times its first-round value (unstable SCAFFOLD runs on
# table1-synthetic swing to 30 times), while runs that blow up reach 1e4 to 1e9 times it
# (FLUTE in flute-fig4, whose model error reaches 5e3 to 5e13 times its first value) or
# 1e5 (SCAFFOLD) before they become non-finite or the run ends.
DEFAULT_BLOWUP = 1e3
# XLA compiler options of the programs of algorithms with `quick_compile`, on the CPU.
QUICK_COMPILE = {"xla_backend_optimization_level": 1, "xla_cpu_use_fusion_emitters": False}


@dataclasses.dataclass
class RunResult:
  """The outcome of `run`.

  state: the final state; metrics[name]: per-round metrics [rounds] ([sweep, rounds] when
  sweeping); seconds: wall time of the rounds and evaluations (initialisation excluded);
  diverged: bool [] ([sweep]), and reference: float32 [] ([sweep]), the tracked metric at
  the run's first round (NaN when there is none), to pass back with `state` when resuming;
  eval_rounds [E]: the rounds (1-based) after which `evaluate` ran, and eval_metrics[name]
  its metrics [E] ([sweep, E]); empty for algorithms without `evaluate`.
  """
  state: Any
  metrics: dict[str, np.ndarray]
  seconds: float
  diverged: Any = None
  reference: Any = None
  eval_rounds: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, int))
  eval_metrics: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Chunk:
  """What `run` gives each of its callbacks after a chunk of rounds.

  rounds: int [k], the chunk's rounds (1-based); metrics[name]: float [k] ([sweep, k] when
  sweeping), those of its rounds; eval_metrics[name]: [] ([sweep]), those of the evaluation
  after its last round, empty where none ran; state: a host copy (numpy leaves) of the state
  after its last round where `run` was asked for it (callback_state), else None.
  """
  rounds: np.ndarray
  metrics: dict[str, np.ndarray]
  eval_metrics: dict[str, np.ndarray]
  state: Any = None

  @property
  def round(self) -> int:
    """The last round of the chunk (1-based): rounds done so far."""
    return int(self.rounds[-1])


def split_run_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(init_key, rounds_key) of a run's key; round t uses fold_in(rounds_key, t)."""
  init_key, rounds_key = jax.random.split(key)
  return init_key, rounds_key


def all_finite(tree) -> jax.Array:
  """True when every floating-point entry of `tree` is finite."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def _tracked(algorithm, metrics):
  """The metric [] that the blow-up bound watches: `algorithm.tracked_metric` where the
  round reports it, else train_loss; None when it reports neither."""
  for name in (algorithm.tracked_metric, "train_loss"):
    if name in metrics:
      return metrics[name]
  return None


def _scan_rounds(algorithm, state, diverged, reference, data, hparams, rounds_key, start,
                 stop, blowup, chunk):
  """`chunk` rounds from round `start`; returns ((state, diverged, reference), metrics [chunk]).

  Rounds at or past `stop`, and every round of a diverged run, leave the state as is
  and report NaN metrics. A round diverges when its new state or metrics are not finite,
  or when the tracked metric (`_tracked`) exceeds `blowup` [] times |reference|;
  the first round run with a NaN `reference` [] sets it to |tracked metric|. A diverged
  round keeps the state before it, and `diverged` (also a metric, 0/1 per round) stays 1
  from then on.
  """

  def body(carry, t):
    state, diverged, reference = carry
    new_state, metrics = algorithm.round(state, jax.random.fold_in(rounds_key, t), data,
                                         hparams)
    active = (t < stop) & ~diverged
    ok = all_finite((new_state, metrics))
    tracked = _tracked(algorithm, metrics)
    if tracked is not None:
      value = jnp.abs(tracked).astype(reference.dtype)
      new_reference = jnp.where(jnp.isnan(reference), value, reference)
      ok &= ~(value > blowup * new_reference)
      reference = jnp.where(active, new_reference, reference)
    keep = active & ok
    state = jax.tree.map(lambda new, old: jnp.where(keep, new, old), new_state, state)
    metrics = jax.tree.map(lambda m: jnp.where(keep, m, jnp.nan), metrics)
    diverged = jnp.where(active, ~ok, diverged)
    return (state, diverged, reference), {**metrics, "diverged": diverged.astype(jnp.float32)}

  return jax.lax.scan(body, (state, diverged, reference), start + jnp.arange(chunk))


def compiler_options(algorithm, platform: str) -> dict | None:
  """The XLA compiler options of `algorithm`'s programs on `platform` (e.g. 'cpu'):
  `QUICK_COMPILE` on the CPU for an algorithm with `quick_compile` set, else None (XLA's
  defaults)."""
  return QUICK_COMPILE if platform == "cpu" and algorithm.quick_compile else None


def jit_by_algorithm(**jit_kwargs):
  """A decorator: `fun(algorithm, ...)` (algorithm static) jitted with `jit_kwargs` and the
  compiler options of `algorithm` on JAX's default backend (`compiler_options`)."""

  def wrap(fun):
    plain = jax.jit(fun, **jit_kwargs)
    quick = jax.jit(fun, compiler_options=QUICK_COMPILE, **jit_kwargs)

    @functools.wraps(fun)
    def call(algorithm, *args, **kwargs):
      jitted = quick if compiler_options(algorithm, jax.default_backend()) else plain
      return jitted(algorithm, *args, **kwargs)

    return call

  return wrap


@dataclasses.dataclass(frozen=True)
class _Frozen:
  """An `in_axes` pytree (e.g. a dict of hparams' axes) as a hashable static argument."""
  treedef: Any
  leaves: tuple

  @classmethod
  def of(cls, tree):
    leaves, treedef = jax.tree.flatten(tree, is_leaf=lambda x: x is None)
    return cls(treedef, tuple(leaves))

  def tree(self):
    return jax.tree.unflatten(self.treedef, self.leaves)


def _frozen_levels(sweep_axes) -> tuple:
  """`checks.sweep_levels` of `sweep_axes`, each axis `_Frozen` (static arguments)."""
  return tuple(tuple(map(_Frozen.of, axes)) for axes in checks.sweep_levels(sweep_axes))


def _nested(fun, levels, axes):
  """`fun` vmapped once per level of `levels` (`_frozen_levels`, outermost first) with
  in_axes `axes(level)`, a level as the (data, hparams, key) axes."""
  for level in reversed(levels):
    fun = jax.vmap(fun, in_axes=axes(tuple(axis.tree() for axis in level)))
  return fun


@jit_by_algorithm(static_argnames=("algorithm", "chunk", "levels"),
                   donate_argnames=("state", "diverged", "reference"))
def _run_chunk(algorithm, state, diverged, reference, data, hparams, key, start, stop, blowup,
               *, chunk, levels):
  rounds_key = _split_keys(key, levels)[1]
  scan = functools.partial(_scan_rounds, algorithm, chunk=chunk)
  scan = _nested(scan, levels, lambda axes: (0, 0, 0, *axes, None, None, None))
  return scan(state, diverged, reference, data, hparams, rounds_key, start, stop, blowup)


@jit_by_algorithm(static_argnames=("algorithm", "levels"))
def _init(algorithm, key, data, hparams, *, levels):
  key = _split_keys(key, levels)[0]
  init = _nested(algorithm.init, levels, lambda axes: (axes[2], axes[0], axes[1]))
  return init(key, data, hparams)


@jit_by_algorithm(static_argnames=("algorithm", "levels"))
def _evaluate(algorithm, state, data, hparams, *, levels):
  evaluate = _nested(algorithm.evaluate, levels, lambda axes: (0, *axes[:2]))
  return evaluate(state, data, hparams)


def init_state(algorithm, data, hparams, key, *, sweep_axes=None):
  """The algorithm's initial state from the run key, after checking the inputs.

  The inputs are checked by `checks.check_run` before anything is traced or compiled; the
  state is computed jitted, vmapped when sweeping.

  Args:
    algorithm: the algorithm object (`core.protocols.Algorithm`).
    data: the run's data pytree.
    hparams: the run's traced hyperparameters.
    key: the run's key (as passed to `run`).
    sweep_axes: `in_axes` of (data, hparams, key) over a leading sweep axis, as in `run`;
      None for a single run.

  Returns:
    The state of `algorithm.init`; its leaves get a leading [sweep] axis when sweeping.
  """
  checks.check_run(algorithm, data, hparams, key, sweep_axes=sweep_axes)
  return _init(algorithm, key, data, hparams, levels=_frozen_levels(sweep_axes))


def evaluate(algorithm, state, data, hparams, *, sweep_axes=None):
  """`algorithm.evaluate` of `state` (jitted; vmapped when sweeping).

  Args:
    algorithm: an algorithm with `evaluate` (`core.protocols.Evaluated`).
    state: its state (leading [sweep] axis when sweeping).
    data: the run's data pytree.
    hparams: the run's traced hyperparameters.
    sweep_axes: `in_axes` of (data, hparams, key) over a leading sweep axis, as in `run`;
      None for a single run.

  Returns:
    The metrics dict of `algorithm.evaluate`: scalars, or [sweep] when sweeping.
  """
  return _evaluate(algorithm, state, data, hparams, levels=_frozen_levels(sweep_axes))


def _split_keys(key, levels):
  split = split_run_key
  for axes in levels:
    if axes[2].tree() == 0:
      split = jax.vmap(split)
  return split(key)


def _placed_like(value, state):
  """`value` replicated over the mesh of a state sharded over devices (as the chunks return
  it, so that the second chunk does not compile again); as is for a state on one device."""
  for leaf in jax.tree.leaves(state):
    if isinstance(leaf.sharding, NamedSharding):
      # Not device_put: across processes it checks that every host passed equal values,
      # and the NaN of an unset reference is unequal to itself.
      return jax.make_array_from_callback(
          value.shape, NamedSharding(leaf.sharding.mesh, PartitionSpec()),
          lambda index: value[index])
  return value


def _masked(eval_metrics, diverged):
  """The metrics of an evaluation ({name: [] or [sweep]}) with NaN for the runs that have
  diverged (`diverged` bool [] or [sweep]); as they are where none has (no change of dtype)."""
  if not np.any(diverged):
    return eval_metrics
  return {name: np.where(diverged, np.nan, value) for name, value in eval_metrics.items()}


EVAL_PREFIX = "eval:"  # names of the evaluation metrics in a checkpoint's history


def _joined(pieces, eval_pieces, axis):
  """(metrics, eval_metrics) of the chunks and evaluations run so far: metrics[name]
  [(sweep,) rounds], eval_metrics[name] [(sweep,) evaluations]."""
  metrics = {name: np.concatenate([p[name] for p in pieces], axis=axis) for name in pieces[0]}
  eval_metrics = {name: np.stack([np.asarray(p[name]) for p in eval_pieces], axis=axis)
                  for name in (eval_pieces[0] if eval_pieces else {})}
  return metrics, eval_metrics


def _history(pieces, eval_pieces, axis) -> dict[str, np.ndarray]:
  """A checkpoint's history: `_joined`'s metrics, and its eval_metrics under EVAL_PREFIX."""
  metrics, eval_metrics = _joined(pieces, eval_pieces, axis)
  return {**metrics, **{EVAL_PREFIX + name: v for name, v in eval_metrics.items()}}


def _split_history(history, eval_rounds, axis):
  """(pieces, eval_rounds, eval_pieces) of a checkpoint's history (`_history`)."""
  pieces = [{k: v for k, v in history.items() if not k.startswith(EVAL_PREFIX)}]
  evals = {k[len(EVAL_PREFIX):]: v for k, v in history.items() if k.startswith(EVAL_PREFIX)}
  eval_pieces = [{k: np.take(v, i, axis=axis) for k, v in evals.items()}
                 for i in range(len(eval_rounds))]
  return pieces, list(eval_rounds), eval_pieces


def _text(value) -> str:
  """repr(value) without object addresses (' at 0x...'), the same in every process."""
  return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def _fingerprint(tree, values: bool) -> str:
  """16 hex digits of a sha256 of `tree`'s structure and its leaves' dtypes and shapes, and
  with `values` of the leaves' values too (read to the host: small trees; a key by its key
  data)."""
  digest = hashlib.sha256(_text(jax.tree.structure(tree)).encode())
  for leaf in jax.tree.leaves(tree):
    leaf = leaf if isinstance(leaf, jax.Array) else np.asarray(leaf)
    digest.update(f"{leaf.dtype}{leaf.shape}".encode())
    if values:
      if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
      digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return digest.hexdigest()[:16]


def _identity(algorithm, data, hparams, key, num_rounds, state, start_round, diverged,
              reference, blowup, eval_every, sweep_axes) -> dict:
  """What a call of `run` computes, as its checkpoints are named by and record
  (`checkpoint.Scope.slot`): the algorithm's name and structure (its repr), the values of the
  key, hparams and a resumed run's flags and reference, the structure, shapes and dtypes
  of data and of a given state (their values are the unit's), the rounds, the blow-up
  bound, the evaluation period and the sweep axes; fingerprints where not plain numbers."""
  given = lambda tree: None if tree is None else _fingerprint(tree, values=True)
  return {"algorithm": algorithm.name,
          "structure": hashlib.sha256(_text(algorithm).encode()).hexdigest()[:16],
          "key": _fingerprint(key, values=True), "hparams": _fingerprint(hparams, values=True),
          "data": _fingerprint(data, values=False),
          "state": None if state is None else _fingerprint(state, values=False),
          "diverged": given(diverged), "reference": given(reference),
          "rounds": [int(start_round), int(num_rounds)],
          "blowup": None if blowup is None else float(blowup),
          "eval_every": None if eval_every is None else int(eval_every),
          "sweep_axes": _text(sweep_axes)}


def _next_boundary(t: int, num_rounds: int, *periods: int) -> int:
  """The first multiple of any of `periods` after round t, capped at num_rounds."""
  return min([num_rounds] + [(t // p + 1) * p for p in periods])


def run(algorithm, data, hparams, key, num_rounds: int, *, state=None, start_round: int = 0,
        diverged=None, reference=None, blowup: float | None = DEFAULT_BLOWUP,
        chunk: int | None = None, eval_every: int | None = None,
        sweep_axes: tuple | list | None = None, progress: bool = True,
        desc: str | None = None, callbacks=(), callback_state: bool = False,
        checkpoints: checkpoint.Scope | None = None) -> RunResult:
  """Runs rounds [start_round, num_rounds) of `algorithm` and returns state and metrics.

  Args:
    algorithm: hashable algorithm object (see module docstring).
    data: the data pytree passed to every round (traced).
    hparams: the hyperparameter pytree passed to every round (traced).
    key: the run's key; every key in the run is derived from it.
    num_rounds: total rounds of the run (>= 1).
    state: state to continue from (resume); default: `algorithm.init`.
    start_round: index of the first round to run (resume).
    diverged: the `diverged` flags of the run being resumed (RunResult.diverged); default
      none diverged.
    reference: the tracked metric's first-round values of the run being resumed
      (RunResult.reference); default: taken from the first round run here.
    blowup: a run diverges when its tracked metric exceeds `blowup` times its first-round
      value (see module docstring); default DEFAULT_BLOWUP (1e3); None: no bound.
    chunk: rounds per compiled scan; one compilation serves every chunk.
    eval_every: for algorithms with `evaluate`: evaluate after every `eval_every` rounds
      (and after the last); None: after the last round only.
    sweep_axes: `in_axes` of (data, hparams, key) to vmap the whole run over a leading
      sweep axis (seeds, step sizes), or a list of them to vmap it over nested leading axes,
      outermost first (`checks.sweep_levels`); None for a single run.
    progress: show a progress bar (rounds done / total, rounds per second).
    desc: the progress bar's label; default `algorithm.name`.
    callbacks: functions called with a `Chunk` after each chunk of rounds run here (in round
      order; not those restored from a checkpoint), e.g. to log metrics as they come.
    callback_state: give the callbacks a host copy of the state (`Chunk.state`).
    checkpoints: where the run checkpoints (`checkpoint.Scope`: its slot for this call,
      `checkpoint.Scope.slot`) and whether a stop was asked for; None: no checkpoints.

  Returns:
    RunResult with metrics[name] of shape [rounds] ([sweep, rounds] when sweeping; [*sweeps,
    rounds] over nested sweeps), where
    rounds = num_rounds - start_round. A run that diverges (its state or a metric becomes
    non-finite, or its tracked metric exceeds the bound) stops there (the state keeps its
    value before that round; the rest of a sweep goes on): from that round on
    metrics["diverged"] is 1 and the other metrics are NaN, and so are its eval_metrics
    from the first evaluation at or after that round.

  Raises:
    ValueError: num_rounds, start_round, chunk, eval_every or blowup out of range. Inputs
      that fail `checks.check_run` raise its errors; all before anything compiles.
    checkpoint.IdentityError: with `checkpoints` (a recipe's unit), a second call with the
      identity of an earlier one, which would share its checkpoints, or a checkpoint of the
      call's name that records another identity (`checkpoint.Scope.slot`).
  """
  checks.check_run(algorithm, data, hparams, key, state, sweep_axes)
  if isinstance(num_rounds, bool) or not isinstance(num_rounds, (int, np.integer)) \
      or num_rounds < 1:
    raise ValueError(f"num_rounds must be an integer >= 1, got {num_rounds!r}")
  if not 0 <= start_round < num_rounds:
    raise ValueError(f"start_round must be in [0, num_rounds={num_rounds}), got {start_round!r}")
  for name, value in (("chunk", chunk), ("eval_every", eval_every)):
    if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
      raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
  if blowup is not None and not blowup > 0:
    raise ValueError(f"blowup must be a number > 0 or None, got {blowup!r}")
  levels = _frozen_levels(sweep_axes)
  slot = checkpoints.slot(algorithm.name, _identity(
      algorithm, data, hparams, key, num_rounds, state, start_round, diverged, reference,
      blowup, eval_every, sweep_axes)) if checkpoints is not None else None
  if state is None:
    state = _init(algorithm, key, data, hparams, levels=levels)
  else:  # the chunks donate the state they carry: keep the caller's arrays valid (a copy;
    # numpy leaves are placed, which compiles nothing; device arrays by jnp.copy, which
    # copies arrays spread over processes, where jax.device_put fails)
    state = jax.tree.map(lambda leaf: jnp.copy(leaf) if isinstance(leaf, jax.Array)
                         else jax.device_put(leaf, may_alias=False), state)
  state = jax.block_until_ready(state)
  sweep_shape = jax.tree.leaves(state)[0].shape[:len(levels)]
  diverged = _placed_like(
      np.zeros(sweep_shape, bool) if diverged is None else np.array(diverged, bool), state)
  reference = _placed_like(np.full(sweep_shape, np.nan, np.float32) if reference is None
                           else np.array(reference, np.float32), state)
  blowup = np.float32(np.inf if blowup is None else blowup)  # numpy: no eager op to compile
  axis = len(levels)  # the rounds axis of the metrics
  evaluated = isinstance(algorithm, Evaluated)
  periods = [eval_every] if evaluated and eval_every else []
  todo = num_rounds - start_round
  chunk = min(chunk or eval_every or DEFAULT_CHUNK, todo)
  pieces, eval_rounds, eval_pieces = [], [], []
  t = start_round
  if slot is not None:
    periods += [slot.every_rounds] if slot.every_rounds else []
    restored = slot.restore({"state": state, "diverged": diverged, "reference": reference})
    if restored is not None:
      t, carry, history, meta = restored
      state, diverged, reference = carry["state"], carry["diverged"], carry["reference"]
      pieces, eval_rounds, eval_pieces = _split_history(history, meta["eval_rounds"], axis)
  start_time = time.perf_counter()
  bar = tqdm(total=todo, initial=t - start_round, unit="round", disable=not progress,
             desc=desc or algorithm.name, leave=False)
  while t < num_rounds:
    stop = _next_boundary(t, num_rounds, chunk, *periods)
    (state, diverged, reference), metrics = _run_chunk(
        algorithm, state, diverged, reference, data, hparams, key, np.int32(t),
        np.int32(stop), blowup, chunk=chunk, levels=levels)
    metrics = jax.device_get(metrics)
    pieces.append({k: np.take(v, np.arange(stop - t), axis=axis) for k, v in metrics.items()})
    evaluation = {}
    if evaluated and (stop == num_rounds or (eval_every and stop % eval_every == 0)):
      evaluation = _masked(jax.device_get(_evaluate(algorithm, state, data, hparams,
                                                    levels=levels)),
                           jax.device_get(diverged))
      eval_rounds.append(stop)
      eval_pieces.append(evaluation)
    if callbacks:
      chunk_report = Chunk(np.arange(t + 1, stop + 1), pieces[-1], evaluation,
                           jax.device_get(state) if callback_state else None)
      for callback in callbacks:
        callback(chunk_report)
    bar.update(stop - t)
    t = stop
    # In a job of several processes, all of them stop and save together.
    asked = None if checkpoints is None else checkpoints.stop()
    stopping = distributed.any_process(asked is not None)
    if slot is not None and t < num_rounds and distributed.any_process(stopping or slot.due(t)):
      slot.save(t, {"state": state, "diverged": diverged, "reference": reference},
                _history(pieces, eval_pieces, axis), {"eval_rounds": eval_rounds})
    if stopping:
      bar.close()
      raise checkpoint.Interrupted(asked or checkpoint.ELSEWHERE, t, num_rounds)
  bar.close()
  jax.block_until_ready(state)
  metrics, eval_metrics = _joined(pieces, eval_pieces, axis)
  return RunResult(state=state, metrics=metrics, seconds=time.perf_counter() - start_time,
                   diverged=diverged, reference=reference,
                   eval_rounds=np.array(eval_rounds, int),
                   eval_metrics=eval_metrics)
