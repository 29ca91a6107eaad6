"""Checkpoints inside a run: what `loop.run` carries between chunks (the state, the
divergence flags) and the metrics so far, saved with orbax every K rounds or T seconds and
when a stop is requested (SIGINT, SIGTERM), and restored when the same run starts again.

A `Scope` (one per unit of work of a recipe, `experiments.outputs.RunDir.checkpoints`),
passed to `loop.run`, gives each call its own `Slot`, named by what the call runs
(`Scope.slot`): a directory
of orbax steps (the round reached), each recording that identity, so a call finds its own
checkpoints whatever order a unit's calls come in; two calls with one identity, and a step
that records another, are refused (`IdentityError`). Without a scope runs save nothing.
Saves are synchronous; orbax renames a step into place once written, so a killed or failed
save (`files.WriteError`) leaves the last step intact. A step that cannot be read is
reported in one line and deleted, and its run goes on from the step before or its start.
"""

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import time

import numpy as np

from fedjax_rep.core import files

DEFAULT_SECONDS = 60.0  # a long unit saves at least this often (at its chunk boundaries)
ELSEWHERE = "a signal to another process of the job"  # `Interrupted.signal_name` there


class Interrupted(Exception):
  """A stop was requested (SIGINT/SIGTERM under `stop_on_signals`): the run saved a
  checkpoint at `round` of `num_rounds` (when inside a scope) and stopped."""

  def __init__(self, signal_name: str, round: int | None = None, num_rounds: int | None = None):
    where = f" at round {round} of {num_rounds}" if round is not None else ""
    super().__init__(f"stopped by {signal_name}{where}")
    self.signal_name, self.round, self.num_rounds = signal_name, round, num_rounds


class IdentityError(ValueError):
  """A `loop.run` call would take another run's checkpoints: a second call of one unit with
  the identity of an earlier one, or a checkpoint that records another identity."""


def check_policy(every_rounds, every_seconds) -> None:
  """Raises ValueError unless every_rounds is an integer >= 1 and every_seconds a number > 0
  (each may be None: never by that rule)."""
  if every_rounds is not None and (isinstance(every_rounds, bool) or not isinstance(
      every_rounds, int) or every_rounds < 1):
    raise ValueError(f"checkpoints every_rounds (--checkpoint-every) must be an integer >= 1 "
                     f"or None, got {every_rounds!r}")
  if every_seconds is not None and (isinstance(every_seconds, bool) or not every_seconds > 0):
    raise ValueError(f"checkpoints every_seconds (--checkpoint-seconds) must be a number > 0 "
                     f"or None, got {every_seconds!r}")


def never() -> None:
  """A `Scope`'s `stop` where nothing asks a run to stop: None."""
  return None


class Scope:
  """Where the `loop.run` calls of one unit of work checkpoint (`loop.run(checkpoints=...)`):
  each call into its own `Slot` of `directory` (`slot`), after the chunks that end on a
  multiple of `every_rounds` and after the first chunk that ends `every_seconds` or more
  after the last save (None: never by that rule); `stop()` says whether a stop was asked
  for (the name of a signal, `Signals.requested`, or None): the run then saves and raises
  `Interrupted`."""

  def __init__(self, directory: str, every_rounds: int | None = None,
               every_seconds: float | None = DEFAULT_SECONDS, stop=never):
    check_policy(every_rounds, every_seconds)
    self.directory, self.every_rounds, self.every_seconds = directory, every_rounds, every_seconds
    self.stop = stop
    self.names = set()  # the slots that calls took so far

  def slot(self, label: str, identity: dict) -> "Slot":
    """The slot of a `loop.run` call, named by what the call runs: directory/LABEL-HASH,
    LABEL (e.g. the algorithm's name) with every character outside [A-Za-z0-9._-] replaced
    by '_', HASH 12 hex digits of a sha256 of `identity` (a dict of JSON values), which the
    slot's checkpoints record.

    Raises:
      IdentityError: an earlier call in the scope took that slot (the same identity).
    """
    identity = json.loads(json.dumps(identity))  # as a checkpoint's JSON gives it back
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    directory = os.path.join(self.directory,
                             f"{re.sub(r'[^A-Za-z0-9._-]', '_', label)}-{digest}")
    if directory in self.names:
      raise IdentityError(f"two runs of one unit would share the checkpoint {directory} (the "
                          f"same algorithm, key, hparams, rounds and data shapes): give them "
                          f"different keys, or run them in units of their own")
    self.names.add(directory)
    return Slot(directory, self.every_rounds, self.every_seconds, identity)


class Signals:
  """The first SIGINT or SIGTERM received under `stop_on_signals`, if any."""

  def __init__(self):
    self.name = None

  def requested(self) -> str | None:
    """The name of the signal that asked the run to stop, or None (a `Scope`'s `stop`)."""
    return self.name


@contextlib.contextmanager
def stop_on_signals():
  """Within it (main thread only), SIGINT and SIGTERM ask the run to stop at the end of the
  current chunk, after saving a checkpoint (`loop.run` raises `Interrupted` where its
  `Scope`'s stop is the `Signals.requested` this yields); a second signal stops at once,
  as without this."""
  signals = Signals()
  previous = {}

  def handler(signum, frame):
    del frame
    if signals.name is not None:  # the second: what the signal would do without us
      signal.signal(signum, previous[signum])
      signal.raise_signal(signum)
      return
    signals.name = signal.Signals(signum).name

  for signum in (signal.SIGINT, signal.SIGTERM):
    previous[signum] = signal.signal(signum, handler)
  try:
    yield signals
  finally:
    for signum, old in previous.items():
      signal.signal(signum, old)


def _silent(record: logging.LogRecord) -> bool:
  """A filter that drops every record."""
  del record
  return False


@contextlib.contextmanager
def _orbax_quiet():
  """Within it, orbax's logger ('absl') drops every record: what fails in a save or a
  restore is raised and reported in one line, not logged with a traceback beside it."""
  absl = logging.getLogger("absl")
  absl.addFilter(_silent)
  try:
    yield
  finally:
    absl.removeFilter(_silent)


class Slot:
  """The checkpoints of one `loop.run` call: orbax steps numbered by the round reached, the
  latest kept. Each holds `carry` (a pytree of arrays: state and flags), `history` (a dict
  of numpy arrays: the metrics so far) and `meta` (JSON), which records `identity` (the
  call's, `slot`; None: a slot made without one)."""

  def __init__(self, directory: str, every_rounds: int | None, every_seconds: float | None,
               identity: dict | None = None):
    self.directory, self.every_rounds, self.every_seconds = directory, every_rounds, every_seconds
    self.identity = identity
    self._last_save = time.monotonic()
    self._manager = None

  def manager(self):
    """The orbax manager of the directory, once the temporary directories of saves cut
    short (by a kill, a full disk) are deleted (by process 0 of a job)."""
    if self._manager is None:
      import orbax.checkpoint as ocp  # here: most runs never save, and orbax is slow to import

      from fedjax_rep.core import distributed  # here: the command line imports jax late
      if os.path.isdir(self.directory) and distributed.is_writer():
        for partial in ocp.utils.tmp_checkpoints(self.directory):
          shutil.rmtree(partial.get())
      self._manager = ocp.CheckpointManager(
          os.path.abspath(self.directory),
          options=ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False))
    return self._manager

  def restore(self, carry_like):
    """(round, carry, history, meta) of the latest checkpoint that can be read, the carry
    laid out like `carry_like` (same shapes, dtypes and shardings); None when there is
    none. One that cannot be read is reported (one line) and deleted. IdentityError where
    it records another identity than the slot's (nothing deleted)."""
    if not os.path.isdir(self.directory):
      return None
    import orbax.checkpoint as ocp

    from fedjax_rep.core import distributed  # here: the command line imports jax late
    steps = sorted(self.manager().all_steps(), reverse=True)
    for i, step in enumerate(steps):
      try:
        with _orbax_quiet():
          meta = self.manager().restore(step, args=ocp.args.Composite(
              meta=ocp.args.JsonRestore())).meta
          saved = self.manager().restore(step, args=ocp.args.Composite(
              carry=ocp.args.StandardRestore(carry_like),
              history=ocp.args.StandardRestore())) if self._own(meta) else None
      except Exception as error:  # whatever orbax or tensorstore report of a damaged step
        why = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        then = f"round {steps[i + 1]}" if i + 1 < len(steps) else "the start of its run"
        distributed.warn(f"checkpoint {os.path.join(self.directory, str(step))} cannot be "
                         f"read ({why}): deleted; going on from {then}")
        self.manager().delete(step)
        continue
      if saved is None:
        raise IdentityError(self._other_run(step, meta))
      self._last_save = time.monotonic()
      return step, saved.carry, {k: np.asarray(v) for k, v in saved.history.items()}, meta
    return None

  def _own(self, meta) -> bool:
    """Whether a checkpoint's `meta` records the slot's identity."""
    return isinstance(meta, dict) and meta.get("identity") == self.identity

  def _other_run(self, step: int, meta) -> str:
    """The one-line refusal of the checkpoint `step`, whose `meta` records another identity
    than the slot's: what differs, and what to do."""
    recorded = meta.get("identity") if isinstance(meta, dict) else None
    recorded, own = (x if isinstance(x, dict) else {} for x in (recorded, self.identity))
    differ = sorted(k for k in {*recorded, *own} if recorded.get(k) != own.get(k))
    what = f"its {', '.join(differ) or 'identity'} differ from this call's"
    return (f"checkpoint {os.path.join(self.directory, str(step))} holds another run ({what}): "
            f"delete {self.directory} to run this call from its start, or start the whole "
            f"run over (--overwrite)")

  def due(self, round: int) -> bool:
    """Whether a chunk that ended at `round` should save."""
    return bool((self.every_rounds and round % self.every_rounds == 0) or (
        self.every_seconds is not None
        and time.monotonic() - self._last_save >= self.every_seconds))

  def save(self, round: int, carry, history: dict, meta: dict) -> None:
    """Saves the step `round` (`meta` with the slot's identity), then deletes the one
    before; WriteError (the step before left intact) when it cannot be written."""
    import orbax.checkpoint as ocp
    try:
      with _orbax_quiet():
        self.manager().save(round, args=ocp.args.Composite(
            carry=ocp.args.StandardSave(carry), history=ocp.args.StandardSave(history),
            meta=ocp.args.JsonSave({**meta, "identity": self.identity})), force=True)
        self.manager().wait_until_finished()
    except (OSError, ValueError) as error:
      code = re.search(r"os_error_code='?(\d+)", str(error))
      if code is not None:  # tensorstore (the arrays) reports the OS's error so
        cause = OSError(int(code[1]), os.strerror(int(code[1])))
      elif isinstance(error, OSError):  # orbax's own writes (metadata, JSON)
        cause = error
      else:
        raise
      raise files.WriteError(os.path.join(self.directory, str(round)), cause) from error
    self._last_save = time.monotonic()
