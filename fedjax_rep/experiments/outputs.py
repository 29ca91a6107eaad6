"""Run directories: atomic writes, resumable units, metrics.csv and config.json."""

import fcntl
import json
import os
import platform
import shutil
import zipfile
from importlib import metadata

import numpy as np

from fedjax_rep.core import checkpoint
from fedjax_rep.core import distributed
from fedjax_rep.core import tree
from fedjax_rep.core.files import WriteError
from fedjax_rep.core.files import atomic_write
from fedjax_rep.experiments.csv_tables import csv_text


def versions() -> dict[str, str]:
  """Versions of the packages and platform that produced a run."""
  out = {"python": platform.python_version(), "platform": platform.platform()}
  for package in ("fedjax_rep", "jax", "jaxlib", "numpy", "optax", "flax"):
    try:
      out[package] = metadata.version(package)
    except metadata.PackageNotFoundError:
      out[package] = "not installed"
  import jax
  out["devices"] = ", ".join(sorted({d.device_kind for d in jax.devices()}))
  return out


class OutputError(OSError):
  """--out cannot hold this run: one line saying why and what to do (the CLI exits 2)."""


class OtherRun(OutputError, FileExistsError):
  """--out holds another run (another recipe, configuration, seeds, grid or code)."""


class InUse(OutputError):
  """Another process runs in --out (it holds the directory's lock)."""


LOCK = ".lock"  # DIR/.lock: locked by the process that writes DIR, holds its process id
COMPLETE = ".complete"  # DIR/.complete: written last, lists the files of a finished run


def _hold(path: str, fd: int) -> None:
  """Locks `fd` (DIR/.lock of `path`) for this process, or closes it and raises InUse
  naming the process id the holder wrote into it."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
    os.close(fd)
    raise InUse(f"run directory {path} is in use by process {holder or '(starting)'} (a "
                f"fedjax-rep run holds {os.path.join(path, LOCK)}); wait for it to end, or "
                f"choose another --out") from None


def check_free(path: str) -> None:
  """InUse when another process holds the lock of the run directory `path`; reads only."""
  try:
    fd = os.open(os.path.join(path, LOCK), os.O_RDONLY)
  except OSError:  # no lock file (or no directory): nothing holds it
    return
  _hold(path, fd)
  os.close(fd)


def lock(path: str) -> int:
  """Locks the run directory `path` (which exists) for this process: flock on DIR/.lock,
  into which it writes its process id. The lock lasts until the returned descriptor is
  closed or the process ends, however it ends (a SIGKILL leaves nothing to clean up).
  InUse when another process holds it; WriteError when it cannot be written."""
  try:
    fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT, 0o666)
  except OSError as error:
    raise WriteError(os.path.join(path, LOCK), error) from error
  _hold(path, fd)
  try:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
  except OSError as error:
    os.close(fd)
    raise WriteError(os.path.join(path, LOCK), error) from error
  return fd


def complete(path: str) -> list[str] | None:
  """The files of the finished run in `path` (as DIR/.complete lists them, all present),
  or None where it is not one. Writes nothing; checked under the directory's lock (InUse
  when another process holds it; in a job of several processes, process 0 checks it)."""
  try:
    with open(os.path.join(path, COMPLETE)) as f:
      files = json.load(f)["files"]
  except (OSError, ValueError, KeyError, TypeError):
    return None
  if distributed.is_writer():
    check_free(path)
  return files if all(os.path.isfile(os.path.join(path, name)) for name in files) else None


class RunDir:
  """An output directory. Units of work finished earlier (same configuration, seeds and
  grid, written by the same code; a config.json without a grid is a run without one) are
  reused, and a unit's checkpoints (`core.checkpoint`, every `every_rounds` rounds or
  `every_seconds` seconds) resume it mid-way, so an interrupted run continues where it
  stopped when started again with the same --out; `stop` says whether a stop was asked for
  (`core.checkpoint.Scope`'s).

  Refused with an OutputError before any work: a path that is a file or cannot be
  created, a non-empty directory that is not a run of this recipe, and a run of it with
  another configuration or written by other code, unless `overwrite` (then the directory's
  earlier parts are deleted and the run starts over; other files are left alone); and
  (InUse) a directory that another process writes. The writing process holds the
  directory's lock (`lock`) until `close` (the end of a `with` block) or its end.

  In a job of several processes (`core.distributed`) every process opens the same
  directory (on a file system they all see) and computes every unit; only process 0 locks
  it and writes files, and barriers keep the processes on the same unit.
  """

  def __init__(self, path: str, config: dict, *, overwrite: bool = False,
               every_rounds: int | None = None,
               every_seconds: float | None = checkpoint.DEFAULT_SECONDS,
               stop=checkpoint.never):
    self.path, self.every_rounds, self.every_seconds = path, every_rounds, every_seconds
    self.stop = stop
    if os.path.exists(path) and not os.path.isdir(path):
      raise OutputError(f"--out {path} is a file, not a directory: give a directory (a new "
                        f"one is created)")
    self._lock = None
    self._every_process(self._check, config, overwrite)  # before process 0 writes
    try:
      self._every_process(self._open, overwrite)
      self.write_json("config.json", config)
      distributed.barrier("fedjax-rep: run directory ready")
    except BaseException:
      self.close()
      raise

  def _every_process(self, check, *args) -> None:
    """check(*args), then on every process of a job the OutputError it raised on any."""
    refused = None
    try:
      check(*args)
    except OutputError as error:
      refused = error
    if distributed.any_process(refused is not None):
      raise refused or OutputError(f"--out {self.path} was refused by another process of the "
                                   f"job (its line says why)")

  def _check(self, config: dict, overwrite: bool) -> None:
    """Refuses a directory that another process holds (InUse: checked by process 0, first,
    as it says why the directory is refused), then, unless `overwrite`, another run in it
    (`_check_previous`)."""
    if distributed.is_writer():
      check_free(self.path)
    if not overwrite:
      self._check_previous(config)

  def _open(self, overwrite: bool) -> None:
    """In process 0: creates the directory and its parts/ and locks it; with `overwrite`,
    deletes its earlier parts (and its mark of a finished run) first."""
    if not distributed.is_writer():
      return
    try:
      os.makedirs(self.path, exist_ok=True)
    except OSError as error:
      raise OutputError(f"--out {self.path} cannot be created ({error.strerror}): give a "
                        f"directory you can write to") from None
    if not os.access(self.path, os.W_OK | os.X_OK):
      raise OutputError(f"--out {self.path} is not writable: give a directory you can write "
                        f"to")
    self._lock = lock(self.path)
    parts = os.path.join(self.path, "parts")
    try:
      if overwrite:
        if os.path.exists(os.path.join(self.path, COMPLETE)):
          os.unlink(os.path.join(self.path, COMPLETE))
        if os.path.isdir(parts):
          shutil.rmtree(parts)
      os.makedirs(parts, exist_ok=True)
    except OSError as error:
      raise WriteError(parts, error) from error

  def close(self) -> None:
    """Releases the directory's lock (when this process holds it)."""
    if self._lock is not None:
      os.close(self._lock)
      self._lock = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def finish(self, files: list[str]) -> None:
    """Marks the run finished, its output `files` written (DIR/.complete, written last)."""
    self.write_json(COMPLETE, {"files": files})

  def _check_previous(self, config: dict) -> None:
    """Refuses (OtherRun) a non-empty `path` that is not a run of config's recipe with the
    same configuration, seeds, grid and plugins (their paths and hashes), written by the
    same code."""
    if not os.path.isdir(self.path) or not set(os.listdir(self.path)) - {LOCK}:
      return
    hint = "choose another --out, or pass --overwrite to start it over"
    try:
      with open(os.path.join(self.path, "config.json")) as f:
        previous = json.load(f)
    except (OSError, ValueError):
      previous = {}
    if previous.get("recipe") != config["recipe"]:
      what = (f"a run of {previous['recipe']}" if previous.get("recipe")
              else "files that are not a run")
      raise OtherRun(f"--out {self.path} is not empty and not a run of {config['recipe']} "
                     f"(it holds {what}); choose another --out, or pass --overwrite to write "
                     f"into it")
    current = json.loads(json.dumps(config))  # tuples -> lists, as stored
    if any(previous.get(key) != current.get(key) for key in ("config", "seeds")) or any(
        (previous.get(key) or None) != (current.get(key) or None) for key in ("grid", "plugins")):
      raise OtherRun(f"{self.path} holds a run with a different configuration, seeds or "
                     f"grid (or plugins); {hint}")
    written = (previous.get("code") or {}).get("source")
    if written and written != current["code"]["source"] and os.listdir(
        os.path.join(self.path, "parts")):
      raise OtherRun(f"{self.path} holds parts written by other code (revision "
                     f"{previous['code'].get('revision')}, this is "
                     f"{current['code']['revision']}): they may not match; {hint}")

  def write_json(self, name: str, value) -> None:
    self.write(name, lambda f: f.write(
        (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()))

  def write_csv(self, name: str, rows: list[dict], first=("algorithm", "seed", "round")) -> None:
    self.write(name, lambda f: f.write(csv_text(rows, first).encode()))

  def write(self, name: str, write) -> None:
    """write(file) into the file `name` of the directory, atomically; in a job of several
    processes only process 0 writes (`core.distributed`)."""
    if distributed.is_writer():
      atomic_write(os.path.join(self.path, name), write)

  def unit(self, name: str, compute):
    """compute() -> a dict of arrays, possibly nested (dicts of dicts: e.g. a final state's
    params), saved as parts/NAME.npz under '/'-joined keys; loaded instead if already there
    (computed again, after one line saying so, where it cannot be read). While it computes,
    its runs checkpoint into `checkpoints(name)`; parts/NAME.ckpt is deleted once the unit
    is saved."""
    path = os.path.join(self.path, "parts", name + ".npz")
    distributed.barrier(f"fedjax-rep: unit {name}")  # every process sees the same parts
    if os.path.exists(path):
      try:
        with np.load(path) as saved:
          return tree.unflatten({k: saved[k] for k in saved.files})
      except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        distributed.warn(f"{path} cannot be read ({error}): computing the unit {name} again")
    result = compute()
    flat = tree.flatten(result)
    self.write(os.path.join("parts", name + ".npz"),
               lambda f: np.savez(f, **{k: np.asarray(v) for k, v in flat.items()}))
    if distributed.is_writer():
      shutil.rmtree(os.path.join(self.path, "parts", name + ".ckpt"), ignore_errors=True)
    return result

  def checkpoints(self, name: str) -> checkpoint.Scope:
    """The checkpoints of the runs (`loop.run` calls) of unit `name`: each into
    parts/NAME.ckpt/ALGORITHM-HASH, named by what the run computes
    (`core.checkpoint.Scope.slot`)."""
    return checkpoint.Scope(os.path.join(self.path, "parts", name + ".ckpt"),
                            self.every_rounds, self.every_seconds, self.stop)
