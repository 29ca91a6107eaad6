"""Run directories: atomic writes, resumable units, metrics.csv and config.json."""

import csv
import io
import json
import os
import platform
import tempfile
from importlib import metadata

import numpy as np
from flax import traverse_util


def atomic_write(path: str, write) -> None:
  """Calls write(file) on a temporary file beside `path`, then renames it onto `path`."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


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


class RunDir:
  """An output directory. Units of work finished earlier (same configuration, seeds and
  grid; a config.json without a grid is a run without one) are reused, so an interrupted
  run continues where it stopped when started again with the same --out."""

  def __init__(self, path: str, config: dict):
    self.path = path
    os.makedirs(os.path.join(path, "parts"), exist_ok=True)
    config_path = os.path.join(path, "config.json")
    if os.path.exists(config_path):
      with open(config_path) as f:
        previous = json.load(f)
      current = json.loads(json.dumps(config))  # tuples -> lists, as stored
      if any(previous.get(key) != current.get(key) for key in ("config", "seeds")) or (
          previous.get("grid") or {}) != (current.get("grid") or {}):
        raise FileExistsError(
            f"{path} holds a run with a different configuration, seeds or grid; choose "
            f"another --out (or delete the directory) to start a new run")
    self.write_json("config.json", config)

  def write_json(self, name: str, value) -> None:
    atomic_write(os.path.join(self.path, name),
                 lambda f: f.write((json.dumps(value, indent=2, sort_keys=True) + "\n").encode()))

  def write_csv(self, name: str, rows: list[dict], first=("algorithm", "seed", "round")) -> None:
    atomic_write(os.path.join(self.path, name),
                 lambda f: f.write(csv_text(rows, first).encode()))

  def unit(self, name: str, compute):
    """compute() -> a dict of arrays, possibly nested (dicts of dicts: e.g. a final state's
    params), saved as parts/NAME.npz under '/'-joined keys; loaded instead if already there."""
    path = os.path.join(self.path, "parts", name + ".npz")
    if os.path.exists(path):
      with np.load(path) as saved:
        return traverse_util.unflatten_dict({k: saved[k] for k in saved.files}, sep="/")
    result = compute()
    flat = traverse_util.flatten_dict(result, sep="/")
    atomic_write(path, lambda f: np.savez(f, **{k: np.asarray(v) for k, v in flat.items()}))
    return result
