"""Runs every recipe of `fedjax-rep list` with --quick and records its metrics.csv's SHA-256
and the XLA compilations it made.

  python scripts/quick_metrics.py --out DIR [--compare OTHER_DIR] [--recipes A B ...]

Each recipe runs in a fresh process (`fedjax-rep run NAME --quick --no-progress
--no-compile-cache --out DIR/NAME`, with a `jax.monitoring` listener counting backend
compilations); DIR/hashes.json maps recipe to hash, DIR/compiles.json to its compile count.
With --compare, the script prints which recipes' metrics.csv differ from OTHER_DIR's, the
largest difference of a numeric cell of each on the earlier file's columns (absolute and
relative; columns added since are named), every recipe's compile counts in both, and exits 1
if any metrics.csv differs on those columns: the check that a change altered no number.
"""

import argparse
import csv
import hashlib
import json
import math
import os
import subprocess
import sys
import time

# Runs the CLI in this process with a listener that counts XLA backend compilations and
# prints the count last (as "compiles N").
COUNTED = """
import sys, jax
from fedjax_rep import cli
count = [0]
jax.monitoring.register_event_duration_secs_listener(
    lambda name, *a, **k: count.__setitem__(0, count[0] + 1)
    if name == "/jax/core/compile/backend_compile_duration" else None)
code = cli.main(sys.argv[1:])
print("compiles", count[0])
sys.exit(code)
"""


def recipe_names() -> list[str]:
  """The recipes `fedjax-rep list` shows, in its order."""
  listing = subprocess.run([sys.executable, "-m", "fedjax_rep", "list"], check=True,
                           capture_output=True, text=True).stdout.splitlines()
  start = listing.index("recipes:") + 1
  names = []
  for line in listing[start:]:
    if not line.startswith("  "):
      break
    names.append(line.split()[0])
  return names


def sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def largest_difference(path_a: str, path_b: str) -> str:
  """The largest absolute and relative difference of the numeric cells of two CSV files of
  the same rows, on the columns of the first (columns the second adds are named, not
  compared), or why they cannot be compared cell by cell."""
  with open(path_a) as a, open(path_b) as b:
    rows_a, rows_b = list(csv.DictReader(a)), list(csv.DictReader(b))
  columns = list(rows_a[0]) if rows_a else []
  added = [c for c in (rows_b[0] if rows_b else {}) if c not in columns]
  if len(rows_a) != len(rows_b) or any(c not in rows_b[0] for c in columns):
    return f"rows or columns differ ({len(rows_a)} and {len(rows_b)} rows)"
  worst_abs = worst_rel = 0.0
  for row_a, row_b in zip(rows_a, rows_b):
    for column in columns:
      x, y = row_a[column], row_b[column]
      if x == y:
        continue
      try:
        u, v = float(x), float(y)
      except ValueError:
        return f"a text cell differs: {x!r} and {y!r}"
      if math.isnan(u) != math.isnan(v):
        return f"NaN in one only: {x} and {y}"
      worst_abs = max(worst_abs, abs(u - v))
      worst_rel = max(worst_rel, abs(u - v) / max(abs(u), abs(v), 1e-30))
  text = ("identical on its columns" if worst_abs == 0 else
          f"largest difference {worst_abs:.3g} (relative {worst_rel:.3g})")
  return text + (f" (new columns: {', '.join(added)})" if added else "")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for the runs and hashes.json")
  parser.add_argument("--compare", help="a directory an earlier call wrote")
  parser.add_argument("--recipes", nargs="+", help="these recipes only (default: all)")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  hashes, compiles = {}, {}
  for name in args.recipes or recipe_names():
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", COUNTED, "run", name, "--quick", "--no-progress",
                          "--no-compile-cache", "--overwrite", "--out",
                          os.path.join(args.out, name)], check=True, capture_output=True,
                         text=True).stdout
    compiles[name] = int(out.split()[-1])
    hashes[name] = sha256(os.path.join(args.out, name, "metrics.csv"))
    print(f"{name:24s} {hashes[name][:16]}  {compiles[name]:4d} compiles  "
          f"{time.perf_counter() - start:6.1f} s", flush=True)
  for file, values in (("hashes.json", hashes), ("compiles.json", compiles)):
    with open(os.path.join(args.out, file), "w") as f:
      json.dump(values, f, indent=1)
  if args.compare is None:
    return 0
  with open(os.path.join(args.compare, "hashes.json")) as f:
    before = json.load(f)
  with open(os.path.join(args.compare, "compiles.json")) as f:
    compiled_before = json.load(f)
  print(f"{'recipe':24s} {'compiles':>9s} {'before':>7s}  metrics.csv")
  texts = {}
  for name in hashes:
    if name not in before:
      texts[name] = "new (not in the earlier run)"
    elif before[name] == hashes[name]:
      texts[name] = "identical"
    else:
      texts[name] = largest_difference(os.path.join(args.compare, name, "metrics.csv"),
                                       os.path.join(args.out, name, "metrics.csv"))
    print(f"{name:24s} {compiles[name]:9d} {compiled_before.get(name, -1):7d}  {texts[name]}")
  differ = sorted(name for name, text in texts.items()
                  if not text.startswith(("identical", "new")))
  new = sorted(name for name, text in texts.items() if text.startswith("new"))
  print(f"{len(hashes)} recipes ({len(new)} new), {len(differ)} differ from {args.compare}: "
        f"{', '.join(differ) or '-'}")
  return 1 if differ else 0


if __name__ == "__main__":
  sys.exit(main())
