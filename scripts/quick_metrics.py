"""Runs every recipe of `fedjax-rep list` with --quick and records its metrics.csv's SHA-256.

  python scripts/quick_metrics.py --out DIR [--compare OTHER_DIR]

Each recipe runs in a fresh process (`python -m fedjax_rep run NAME --quick --no-progress
--out DIR/NAME`); DIR/hashes.json maps recipe to hash. With --compare, the script prints
which recipes' metrics.csv differ from OTHER_DIR's and exits 1 if any do: the check that a
refactor changed no number.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time


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


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="directory for the runs and hashes.json")
  parser.add_argument("--compare", help="a directory an earlier call wrote")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  hashes = {}
  for name in recipe_names():
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fedjax_rep", "run", name, "--quick", "--no-progress",
                    "--overwrite", "--out", os.path.join(args.out, name)], check=True,
                   stdout=subprocess.DEVNULL)
    hashes[name] = sha256(os.path.join(args.out, name, "metrics.csv"))
    print(f"{name:24s} {hashes[name][:16]}  {time.perf_counter() - start:6.1f} s", flush=True)
  with open(os.path.join(args.out, "hashes.json"), "w") as f:
    json.dump(hashes, f, indent=1)
  if args.compare is None:
    return 0
  with open(os.path.join(args.compare, "hashes.json")) as f:
    before = json.load(f)
  differ = sorted(name for name in set(before) | set(hashes) if before.get(name) != hashes.get(name))
  print(f"{len(hashes)} recipes, {len(differ)} differ from {args.compare}: {', '.join(differ) or '-'}")
  return 1 if differ else 0


if __name__ == "__main__":
  sys.exit(main())
