"""The batch runner: how every recipe runs its runs.

A recipe says WHAT to run: an algorithm, its data (R runs along a leading axis, e.g. seeds
or sample sizes, with a key each) and G settings (hparams of one structure: grid
combinations, algorithms that differ by a traced number, costs). `Batch.train` runs the
G x R runs as few compiled programs as fit: settings over runs as nested vmaps, so the
data are held once whatever G (a settings axis of None for them), split into calls of
`width` settings (the last call padded with its last setting, so that every call runs one
compiled program), each call a cached unit of work whose runs checkpoint into its unit's
scope and log live to the tracker, both passed in, never found in module state.
"""

import dataclasses
import sys
from collections.abc import Callable

import jax
import numpy as np

from fedjax_rep.core import checkpoint
from fedjax_rep.core import loop
from fedjax_rep.core import memory

# Of one run's state, the copies a chunk holds at once (the carried state, the new one, the
# donated buffers and the optimiser's); a run's data are held once for every setting.
STATE_COPIES = 4
# Settings per call of a program, by backend (elsewhere: as many as fit in memory), measured
# by benchmarks/nn_sweep.py (docs/benchmarks.md). On the CPU one: XLA:CPU's results depend
# on a vmap's width in the last digits (srpfl-linear's FedRep, 18 runs against 2), so one
# setting at a time gives every setting the numbers it has alone, bit for bit; a wide vmap
# of the CIFAR CNN is no faster there (4 settings: 1.05x the time of one after another) and
# holds more (1.20 against 0.68 GiB); the digits MLP would gain (8 settings: 0.64x).
WIDTHS = {"cpu": 1}


def compute_now(name: str, compute):
  """A unit of work that is computed, not cached (`Batch.unit` without a store)."""
  del name
  return compute()


def default_width(platform: str | None = None) -> int | None:
  """The settings per call on `platform` (default: JAX's default backend), `WIDTHS`; None:
  as many as fit in memory."""
  return WIDTHS.get(platform or jax.default_backend())


@dataclasses.dataclass
class Batch:
  """How a recipe's runs run and where what they compute goes.

  unit(name, compute) caches a unit of work (`outputs.RunDir.unit`; default: computed now);
  checkpoints(name) is the `core.checkpoint.Scope` of a unit's runs (None: none); progress
  shows progress bars; tracker (`tracking.Tracker`, None: none) logs the runs as they
  compute; width: settings per call of a program (None: `default_width`); available:
  the memory the runs may use (None: `core.memory.available_bytes()`); search
  (`search.Search`, None: none) stops a grid's settings early (`train`'s searched).
  """
  unit: Callable = compute_now
  checkpoints: Callable[[str], checkpoint.Scope | None] = lambda name: None
  progress: bool = True
  tracker: object = None
  width: int | None = None
  available: int | None = None
  search: object = None

  def prefixed(self, prefix: str) -> "Batch":
    """This batch with its units and their checkpoints named PREFIX + name (e.g. a grid's
    shape-changing combination, 'num_clients=100--')."""
    return dataclasses.replace(
        self, unit=lambda name, compute: self.unit(prefix + name, compute),
        checkpoints=lambda name: self.checkpoints(prefix + name))

  def live(self, members: list[dict] | None) -> tuple:
    """`loop.run` callbacks that log the runs `members` (their metrics.csv columns, one dict
    per run in the sweep's order) to the tracker as they compute; none without a tracker or
    members."""
    return () if self.tracker is None or not members else (self.tracker.live(members),)

  def train(self, name: str, algorithm, data, settings: list, keys, rounds: int, *,
            members: list[list[dict]] | None = None, eval_every: int | None = None,
            blowup: float | None = loop.DEFAULT_BLOWUP, starts: list | None = None,
            keep: Callable | None = None, desc: str | None = None,
            searched: bool = False) -> list[dict]:
    """Runs `algorithm` with each of the G `settings` on every run of `data`.

    Args:
      name: the unit's name ('<name>', or '<name>-settings<A>-<B>' where the settings take
        several calls).
      algorithm: the algorithm (`core.protocols.Algorithm`).
      data: the data pytree, leaves [R, ...]: R runs (seeds, sample sizes, ...).
      settings: G hparams pytrees of one structure, unbatched. Leaves equal in every
        setting are passed once (a vmap axis of None), the others stacked.
      keys: the run keys [R].
      rounds: rounds of every run.
      members: members[g][r], the metrics.csv columns of setting g on run r (algorithm,
        seed, settings), with which the tracker logs them live.
      eval_every, blowup: as `loop.run`'s.
      starts: per setting, the algorithm whose `init` gives its initial state (default:
        `algorithm`), e.g. two initialisations of one program.
      keep: keep(state) -> a dict of arrays of the final state to return, with the state's
        leading axis of runs (leaves [W * R, ...]: W settings of a call, setting-major).
      desc: the progress bars' label (default: name).
      searched: the settings are a grid's candidates that the batch's `search` (if any)
        may stop early (`search.Search.train`: members required, starts and keep not
        taken); otherwise every setting runs every round.

    Returns:
      One dict per setting, in order: "metrics" {name: [R, rounds]}, where the algorithm
      evaluates "eval_rounds" [E] and "eval" {name: [R, E]}, and keep's entries ([R, ...]);
      under a search, NaN from the round after a setting was stopped.
    """
    if searched and self.search is not None and len(settings) > 1:
      if starts is not None or keep is not None or not members:
        raise ValueError("a search takes members and neither starts nor keep")
      return self.search.train(self, name, algorithm, data, settings, keys, rounds,
                               members=members, eval_every=eval_every, blowup=blowup,
                               desc=desc)
    return self.calls(name, algorithm, data, settings, keys, rounds, members=members,
                      eval_every=eval_every, blowup=blowup, starts=starts, keep=keep,
                      desc=desc)

  def calls(self, name: str, algorithm, data, settings: list, keys, rounds: int, *,
            members=None, eval_every=None, blowup=loop.DEFAULT_BLOWUP, starts=None,
            keep=None, desc=None, carried: list | None = None, start_round: int = 0,
            carry: bool = False) -> list[dict]:
    """`train` without a search, and from given states: `carried` (None: from init), per
    setting its runs' {"state": the state, leaves [R, ...], "diverged": [R], "reference":
    [R]} (as `carry` returns them) after round `start_round`; rounds [start_round, rounds)
    run. With `carry`, each setting's result also has "carry", its runs' state after the
    last round in that form (leaves of the state under "state" as {"0000": leaf, ...})."""
    count = len(settings)
    width = self._width(algorithm, data, settings, keys, starts)
    calls = -(-count // width)
    axes = _settings_axes(settings)
    runs = jax.tree.leaves(data)[0].shape[0]
    structure = None if carried is None else jax.tree.structure(
        jax.eval_shape(algorithm.init, *_one_run(keys, data), settings[0]))
    results = []
    for start in range(0, count, width):
      chosen = list(range(start, min(start + width, count)))
      padded = chosen + chosen[-1:] * (width - len(chosen))  # one shape for every call
      unit_name = name if calls == 1 else f"{name}-settings{start}-{start + width - 1}"
      flat_members = members and [m for g in chosen for m in members[g]]
      resume = carried and (_stacked_carry([carried[g] for g in padded], structure),
                            start_round)

      def compute(padded=padded, unit_name=unit_name, flat_members=flat_members,
                  resume=resume):
        return self._call(unit_name, algorithm, data, [settings[g] for g in padded], axes,
                          keys, rounds, eval_every, blowup,
                          starts and [starts[g] for g in padded], keep, desc or unit_name,
                          flat_members, resume, carry)

      flat = self.unit(unit_name, compute)
      results += [_runs(flat, i * runs, (i + 1) * runs) for i in range(len(chosen))]
    return results

  def _width(self, algorithm, data, settings, keys, starts) -> int:
    """The settings per call: `width` (else `default_width`), at most those that fit in
    memory (`settings_that_fit`, estimated only where more than one is asked; said on
    stderr where fewer fit), at least 1."""
    count = len(settings)
    asked = min(count, self.width or default_width() or count)
    if asked == 1:
      return 1
    fit, per_setting = settings_that_fit(algorithm if starts is None else starts[0], data,
                                         settings[0], keys, self.available)
    width = max(1, min(asked, fit))
    if width < asked:
      print(f"fedjax-rep: {count} settings need about {count * per_setting / 1e9:.2f} GB "
            f"beside the data, more than fits; running them in calls of {width}",
            file=sys.stderr)
    return width

  def _call(self, unit_name, algorithm, data, settings, axes, keys, rounds, eval_every,
            blowup, starts, keep, desc, members, resume=None, carry=False) -> dict:
    """One `loop.run` of `settings` (W of them) on every run of `data`: runs [W * R] (setting
    g's run r at g * R + r) in the returned arrays; resume: (carry of the W settings' runs,
    leaves [W * R, ...], as `_stacked_carry` gives it; the round it is after) or None."""
    width, count = len(settings), len(members) if members else None
    runs = jax.tree.leaves(data)[0].shape[0]
    if width == 1:  # no settings axis
      hparams, sweep_axes = settings[0], (0, None, 0)
    else:
      hparams, sweep_axes = _stacked(settings, axes), [(None, axes, None), (0, None, 0)]
    state = None
    if starts is not None:  # on the host: no eager device op, so nothing compiles
      states = [loop.init_state(start, data, each, keys, sweep_axes=(0, None, 0))
                for start, each in zip(starts, settings)]
      state = jax.device_get(states[0]) if width == 1 else jax.tree.map(
          lambda *x: np.stack([np.asarray(v) for v in x]), *states)
    flags, start_round = {}, 0
    if resume is not None:
      given, start_round = resume
      shaped = lambda a: np.reshape(a, (width, runs, *np.shape(a)[1:]) if width > 1
                                    else np.shape(a))
      state = jax.tree.map(shaped, given["state"])
      flags = {"diverged": shaped(given["diverged"]), "reference": shaped(given["reference"])}
    callbacks = self.live(members)
    if callbacks and width > 1:
      callbacks = tuple(_flattened(callback, count) for callback in callbacks)
    result = loop.run(algorithm, data, hparams, keys, rounds, state=state, blowup=blowup,
                      eval_every=eval_every, sweep_axes=sweep_axes, progress=self.progress,
                      desc=desc, callbacks=callbacks, checkpoints=self.checkpoints(unit_name),
                      start_round=start_round, **flags)
    flat = lambda tree: jax.tree.map(
        lambda a: np.asarray(a).reshape(width * runs, *np.shape(a)[1 + (width > 1):]), tree)
    out = {"metrics": flat(result.metrics)}
    if carry:
      leaves = jax.tree.leaves(flat(jax.device_get(result.state)))
      out["carry"] = {"state": {f"{i:04d}": leaf for i, leaf in enumerate(leaves)},
                      **flat({"diverged": result.diverged, "reference": result.reference})}
    if result.eval_metrics:
      out.update(eval_rounds=result.eval_rounds, eval=flat(result.eval_metrics))
    if keep is not None:
      state = flat(jax.device_get(result.state))
      out.update(keep(state))
    return out


def _one_run(keys, data) -> tuple:
  """(key, data) of one run, as shapes (`jax.ShapeDtypeStruct`) without the run axis."""
  one = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), tree)
  return one(keys), one(data)


def _stacked_carry(carried: list[dict], structure) -> dict:
  """The carries of W settings (each as `Batch.calls` returns it: {"state": {"0000": leaf
  [R, ...], ...}, "diverged": [R], "reference": [R]}) as one, leaves [W * R, ...], the
  state a pytree of `structure`."""
  joined = lambda *x: np.concatenate([np.asarray(v) for v in x])
  states = [jax.tree.unflatten(structure, [c["state"][k] for k in sorted(c["state"])])
            for c in carried]
  return {"state": jax.tree.map(joined, *states),
          "diverged": joined(*[c["diverged"] for c in carried]),
          "reference": joined(*[c["reference"] for c in carried])}


def _flattened(callback, count: int):
  """`callback` of a `loop.Chunk` whose metrics have leading [W, R] axes, given them as
  [W * R] and only the first `count` runs (the settings that are not padding)."""

  def call(chunk: loop.Chunk):
    flat = lambda tree: {k: np.reshape(v, (-1, *np.shape(v)[2:]))[:count]
                         for k, v in tree.items()}
    callback(dataclasses.replace(chunk, metrics=flat(chunk.metrics),
                                 eval_metrics=flat(chunk.eval_metrics)))

  return call


def _runs(flat: dict, start: int, stop: int) -> dict:
  """The runs start..stop-1 of a call's result (eval_rounds is every run's)."""
  pick = lambda tree: jax.tree.map(lambda a: np.asarray(a)[start:stop], tree)
  return {key: value if key == "eval_rounds" else pick(value) for key, value in flat.items()}


def _settings_axes(settings: list):
  """The vmap in_axes over settings of their hparams (a pytree of their structure): 0 for a
  leaf that differs between settings, None for one equal in all (0 for the first leaf where
  all are equal: a vmap needs one axis)."""
  leaves = [jax.tree.leaves(s) for s in settings]
  varies = [any(not np.array_equal(np.asarray(first), np.asarray(other), equal_nan=True)
                for other in others)
            for first, *others in zip(*leaves)]
  varies[0] = varies[0] or not any(varies)
  return jax.tree.unflatten(jax.tree.structure(settings[0]),
                            [0 if v else None for v in varies])


def _stacked(settings: list, axes):
  """The hparams of `settings` for the in_axes `axes`: leaves of axis 0 stacked [W, ...]
  (numpy: no eager device op), the others as the first setting's."""
  return jax.tree.map(lambda axis, *leaves: np.stack([np.asarray(x) for x in leaves])
                      if axis == 0 else leaves[0], axes, *settings,
                      is_leaf=lambda x: x is None)


def settings_that_fit(algorithm, data, hparams, keys, available: int | None = None) -> tuple:
  """(settings, per_setting): how many settings of `algorithm` on every run of `data` fit in
  `core.memory.USABLE` of the memory `available` (default `core.memory.available_bytes()`)
  beside one copy of the data, at STATE_COPIES of a setting's states (all runs'); and the
  bytes per setting."""
  state = jax.eval_shape(algorithm.init, *_one_run(keys, data), hparams)
  size = lambda tree: sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                          for a in jax.tree.leaves(tree))
  runs = jax.tree.leaves(data)[0].shape[0]
  per_setting = STATE_COPIES * size(state) * runs
  available = memory.available_bytes() if available is None else available
  room = int(memory.USABLE * available) - size(data)
  return max(1, room // max(1, per_setting)), per_setting
