"""Run directories: atomic writes, resumable units, metrics.csv and config.json."""

import csv
import io
import json
import os
import platform
import shutil
from importlib import metadata

import numpy as np

from fedjax_rep.core import checkpoint
from fedjax_rep.core import distributed
from fedjax_rep.core import tree
from fedjax_rep.core.files import atomic_write


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


def csv_text(rows: list[dict], first=("algorithm", "seed", "round")) -> str:
  """CSV of `rows` (dicts); columns are `first`, then the rest in first-seen order."""
  columns = list(first)
  for row in rows:
    columns += [c for c in row if c not in columns]
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=columns, restval="", lineterminator="\n")
  writer.writeheader()
  for row in rows:
    writer.writerow({k: (f"{v:.8g}" if isinstance(v, float) else v) for k, v in row.items()})
  return buffer.getvalue()


class OutputError(OSError):
  """--out cannot hold this run: one line saying why and what to do (the CLI exits 2)."""


class OtherRun(OutputError, FileExistsError):
  """--out holds another run (another recipe, configuration, seeds, grid or code)."""


class RunDir:
  """An output directory. Units of work finished earlier (same configuration, seeds and
  grid, written by the same code; a config.json without a grid is a run without one) are
  reused, and a unit's checkpoints (`core.checkpoint`, every `every_rounds` rounds or
  `every_seconds` seconds) resume it mid-way, so an interrupted run continues where it
  stopped when started again with the same --out.

  Refused with an OutputError before any work: a path that is a file or cannot be
  created, a non-empty directory that is not a run of this recipe, and a run of it with
  another configuration or written by other code, unless `overwrite` (then the directory's
  earlier parts are deleted and the run starts over; other files are left alone).

  In a job of several processes (`core.distributed`) every process opens the same
  directory (on a file system they all see) and computes every unit; only process 0 writes
  files, and barriers keep the processes on the same unit.
  """

  def __init__(self, path: str, config: dict, *, overwrite: bool = False,
               every_rounds: int | None = None,
               every_seconds: float | None = checkpoint.DEFAULT_SECONDS):
    self.path, self.every_rounds, self.every_seconds = path, every_rounds, every_seconds
    if os.path.exists(path) and not os.path.isdir(path):
      raise OutputError(f"--out {path} is a file, not a directory: give a directory (a new "
                        f"one is created)")
    if not overwrite:
      self._check_previous(config)
    distributed.barrier("fedjax-rep: run directory checked")  # before process 0 writes
    if distributed.is_writer():
      parts = os.path.join(path, "parts")
      if overwrite and os.path.isdir(parts):
        shutil.rmtree(parts)
      try:
        os.makedirs(parts, exist_ok=True)
      except OSError as error:
        raise OutputError(f"--out {path} cannot be created ({error.strerror}): give a "
                          f"directory you can write to") from None
      if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"--out {path} is not writable: give a directory you can write to")
    self.write_json("config.json", config)
    distributed.barrier("fedjax-rep: run directory ready")

  def _check_previous(self, config: dict) -> None:
    """Refuses (OtherRun) a non-empty `path` that is not a run of config's recipe with the
    same configuration, seeds and grid, written by the same code."""
    if not os.path.isdir(self.path) or not os.listdir(self.path):
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
    if any(previous.get(key) != current.get(key) for key in ("config", "seeds")) or (
        previous.get("grid") or {}) != (current.get("grid") or {}):
      raise OtherRun(f"{self.path} holds a run with a different configuration, seeds or "
                     f"grid; {hint}")
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
    params), saved as parts/NAME.npz under '/'-joined keys; loaded instead if already there.
    While it computes, its runs checkpoint into parts/NAME.ckpt (deleted once it is saved)."""
    path = os.path.join(self.path, "parts", name + ".npz")
    distributed.barrier(f"fedjax-rep: unit {name}")  # every process sees the same parts
    if os.path.exists(path):
      with np.load(path) as saved:
        return tree.unflatten({k: saved[k] for k in saved.files})
    checkpoints = os.path.join(self.path, "parts", name + ".ckpt")
    with checkpoint.scope(checkpoints, self.every_rounds, self.every_seconds):
      result = compute()
    flat = tree.flatten(result)
    self.write(os.path.join("parts", name + ".npz"),
               lambda f: np.savez(f, **{k: np.asarray(v) for k, v in flat.items()}))
    if distributed.is_writer():
      shutil.rmtree(checkpoints, ignore_errors=True)
    return result
