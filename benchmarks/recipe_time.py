"""Wall time of `fedjax-rep run RECIPE` with empty, partly and fully warm caches.

  python benchmarks/recipe_time.py                          # fedrep-fig3, 3 repeats
  python benchmarks/recipe_time.py flute-fig1 --quick --repeats 2 --json out.json

Each repeat starts from a new, empty cache directory ($FEDJAX_REP_CACHE) and times three
runs, each a new process timed whole (interpreter start included):
  cold         empty cache: every program is traced and compiled, then stored in JAX's
               persistent compilation cache;
  warm         the same cache again: the programs are traced and loaded from the cache,
               nothing is compiled;
  no cache     `--no-compile-cache`: everything compiled, nothing stored.
Every run's metrics.csv must equal the cold run's byte for byte (the script stops if not).
Each repeat also times the floor of any run, a process that only imports jax and starts its
backend (`python -c FLOOR`): the host's speed, to compare runs measured on different days;
each repeat's warm run over its floor is printed as `warm over floor`.
The load average is printed before each repeat: on a shared machine, compare times within
one repeat.

With `--baseline REV`, each repeat also times the same command run by the package as it was
at git revision REV (extracted with `git archive` into a temporary directory and put first
on PYTHONPATH; a new empty $FEDJAX_REP_CACHE, so its run is cold if that code caches at
all), and prints its time over this code's cold and warm runs: a speed-up measured on one
host in one sitting, so it compares across days where the raw times do not. Its
metrics.csv is compared with this code's number by number (the largest absolute and
relative differences are printed; the programs differ, so the last bits may).
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

WAYS = ("cold", "warm", "no cache")
FLOOR = "import jax; jax.devices()"


def run_seconds(args: list[str], out: str, cache: str | None = None,
                package: str | None = None) -> float:
  """Seconds of one `fedjax-rep run ARGS --no-progress --out OUT` process, interpreter start
  included: with the compilation cache and stored programs in the directory `cache`, or
  with none (`--no-compile-cache`) when cache is None; the fedjax_rep package found in the
  directory `package` when given (first on PYTHONPATH), else the installed one."""
  out = os.path.abspath(out)
  command = [sys.executable, "-m", "fedjax_rep", "run", *args, "--no-progress", "--out", out,
             *(["--no-compile-cache"] if cache is None else [])]
  env = os.environ if cache is None else {**os.environ, "FEDJAX_REP_CACHE": cache}
  if package is not None:
    env = {**env, "PYTHONPATH": os.pathsep.join(
        [package, *filter(None, [os.environ.get("PYTHONPATH")])])}
  os.makedirs(out, exist_ok=True)  # the run's working directory: `python -m` puts it first
  start = time.perf_counter()       # on sys.path, and a checkout there would be imported
  subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env, cwd=out)
  return time.perf_counter() - start


def floor_seconds() -> float:
  """Seconds of a process that imports jax and starts its backend (interpreter start
  included): what every run costs before its own work."""
  start = time.perf_counter()
  subprocess.run([sys.executable, "-c", FLOOR], check=True)
  return time.perf_counter() - start


def extract(revision: str, work: str) -> str:
  """A directory under `work` holding the repository's files at git `revision` (`git
  archive`, run in this script's checkout): the package as it was then."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = tempfile.mkdtemp(dir=work, prefix="baseline-")
  archive = subprocess.run(["git", "-C", root, "archive", "--format=tar", revision],
                           capture_output=True)
  if archive.returncode:
    sys.exit(f"--baseline {revision}: git archive failed in {root}: "
             f"{archive.stderr.decode().strip()}")
  subprocess.run(["tar", "-x", "-C", path], input=archive.stdout, check=True)
  return path


def differences(path_a: str, path_b: str) -> tuple[float, float]:
  """(largest absolute, largest relative) difference between the numbers of two CSV files
  with the same header and rows (relative to the first file's value; an entry that is not
  a number must be equal). SystemExit naming what differs otherwise."""
  with open(path_a) as fa, open(path_b) as fb:
    a, b = list(csv.reader(fa)), list(csv.reader(fb))
  if a[0] != b[0] or len(a) != len(b):
    sys.exit(f"{path_b}: columns or row count differ from {path_a}")
  largest_abs = largest_rel = 0.0
  for row_a, row_b in zip(a[1:], b[1:]):
    for x, y in zip(row_a, row_b):
      try:
        x, y = float(x), float(y)
      except ValueError:
        if x != y:
          sys.exit(f"{path_b}: {y!r} where {path_a} has {x!r}")
        continue
      if np.isfinite(x) or np.isfinite(y):
        largest_abs = max(largest_abs, abs(x - y))
        largest_rel = max(largest_rel, abs(x - y) / max(abs(x), np.finfo(np.float32).tiny))
  return largest_abs, largest_rel


def repeat(recipe: str, quick: bool, work: str, baseline: str | None = None):
  """Seconds of each way (module docstring), from a new cache directory under `work`, and
  of the floor (`floor_seconds`); with `baseline` (a package directory, see `extract`),
  also the seconds of its cold run, and its metrics.csv's (absolute, relative) differences
  from this code's (`differences`, else None)."""
  cache = tempfile.mkdtemp(dir=work, prefix="cache-")
  seconds, outputs = {"floor": floor_seconds()}, {}
  for way in WAYS:
    outputs[way] = tempfile.mkdtemp(dir=work, prefix="run-")
    seconds[way] = run_seconds([recipe] + ["--quick"] * quick, outputs[way],
                               None if way == "no cache" else cache)
    with open(os.path.join(outputs[way], "metrics.csv"), "rb") as f, \
        open(os.path.join(outputs["cold"], "metrics.csv"), "rb") as g:
      if f.read() != g.read():
        sys.exit(f"{recipe}: metrics.csv of the {way} run differs from the cold run's")
  if baseline is None:
    return seconds, None
  out = tempfile.mkdtemp(dir=work, prefix="baseline-run-")
  seconds["baseline"] = run_seconds([recipe] + ["--quick"] * quick, out,
                                    tempfile.mkdtemp(dir=work, prefix="cache-"), baseline)
  return seconds, differences(os.path.join(outputs["cold"], "metrics.csv"),
                              os.path.join(out, "metrics.csv"))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("recipe", nargs="?", default="fedrep-fig3")
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--baseline", metavar="REV",
                      help="also time the package at this git revision (module docstring)")
  parser.add_argument("--json", help="write the rows to this file")
  args = parser.parse_args()
  rows = []
  with tempfile.TemporaryDirectory() as work:
    baseline = None if args.baseline is None else extract(args.baseline, work)
    for i in range(args.repeats):
      load = os.getloadavg()[0]
      seconds, diff = repeat(args.recipe, args.quick, work, baseline)
      rows.append({"recipe": args.recipe, "quick": args.quick, "repeat": i, "load": load,
                   **{f"{way} s": s for way, s in seconds.items()},
                   "warm over floor": seconds["warm"] / seconds["floor"]})
      if baseline is not None:
        rows[-1].update({"baseline": args.baseline, "baseline over cold": seconds["baseline"] /
                         seconds["cold"], "baseline over warm": seconds["baseline"] /
                         seconds["warm"], "max abs diff": diff[0], "max rel diff": diff[1]})
      print(f"repeat {i}: load {load:.2f}: " + ", ".join(
          f"{way} {s:.2f} s" for way, s in seconds.items()), flush=True)
  print(f"\n{args.recipe}{' --quick' if args.quick else ''}: seconds per run, "
        f"{args.repeats} repeats (metrics.csv byte-identical in every run of this code)")
  print(f"{'way':<18} " + " ".join(f"{'#' + str(r['repeat']):>7}" for r in rows) +
        f" {'best':>7}")
  ways = ("floor", *WAYS, *(("baseline",) if baseline else ()))
  best = {way: min(r[f"{way} s"] for r in rows) for way in ways}
  for way in ways:
    print(f"{way:<18} " + " ".join(f"{r[f'{way} s']:7.2f}" for r in rows) +
          f" {best[way]:7.2f}")
  print(f"{'warm over floor':<18} " + " ".join(f"{r['warm over floor']:7.2f}" for r in rows)
        + f" {best['warm'] / best['floor']:7.2f}")
  if baseline is not None:  # the ratio of one repeat's times; best: of the best times
    for way in ("cold", "warm"):
      print(f"{'baseline over ' + way:<18} " + " ".join(
          f"{r['baseline over ' + way]:7.2f}" for r in rows) +
            f" {best['baseline'] / best[way]:7.2f}")
    print(f"baseline: {args.baseline}; its metrics.csv against this code's: largest "
          f"difference {max(r['max abs diff'] for r in rows):.3g} absolute, "
          f"{max(r['max rel diff'] for r in rows):.3g} relative")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
