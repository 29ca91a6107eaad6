"""Wall time of `fedjax-rep run RECIPE` with empty, partly and fully warm caches.

  python benchmarks/recipe_time.py                          # fedrep-fig3, 3 repeats
  python benchmarks/recipe_time.py flute-fig1 --quick --repeats 2 --json out.json

Each repeat starts from a new, empty cache directory ($FEDJAX_REP_CACHE) and times three
runs, each a new process timed whole (interpreter start included):
  cold         empty cache: every program is traced and compiled, then stored;
  warm         the same cache again: the stored executables run, nothing is traced or
               compiled;
  no cache     `--no-compile-cache`: everything compiled, nothing stored.
Every run's metrics.csv must equal the cold run's byte for byte (the script stops if not).
Each repeat also times the floor of any run, a process that only imports jax and starts its
backend (`python -c FLOOR`): the host's speed, to compare runs measured on different days.
The load average is printed before each repeat: on a shared machine, compare times within
one repeat.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

WAYS = ("cold", "warm", "no cache")
FLOOR = "import jax; jax.devices()"


def run_seconds(args: list[str], out: str, cache: str | None = None) -> float:
  """Seconds of one `fedjax-rep run ARGS --no-progress --out OUT` process, interpreter start
  included: with the compilation cache and stored programs in the directory `cache`, or
  with none (`--no-compile-cache`) when cache is None."""
  command = [sys.executable, "-m", "fedjax_rep", "run", *args, "--no-progress", "--out", out,
             *(["--no-compile-cache"] if cache is None else [])]
  env = os.environ if cache is None else {**os.environ, "FEDJAX_REP_CACHE": cache}
  start = time.perf_counter()
  subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
  return time.perf_counter() - start


def floor_seconds() -> float:
  """Seconds of a process that imports jax and starts its backend (interpreter start
  included): what every run costs before its own work."""
  start = time.perf_counter()
  subprocess.run([sys.executable, "-c", FLOOR], check=True)
  return time.perf_counter() - start


def repeat(recipe: str, quick: bool, work: str) -> dict[str, float]:
  """Seconds of each way (module docstring), from a new cache directory under `work`, and
  of the floor (`floor_seconds`)."""
  cache = tempfile.mkdtemp(dir=work, prefix="cache-")
  seconds, outputs = {"floor": floor_seconds()}, {}
  for way in WAYS:
    out = tempfile.mkdtemp(dir=work, prefix="run-")
    seconds[way] = run_seconds([recipe] + ["--quick"] * quick, out,
                               None if way == "no cache" else cache)
    with open(os.path.join(out, "metrics.csv"), "rb") as f:
      outputs[way] = f.read()
    if outputs[way] != outputs["cold"]:
      sys.exit(f"{recipe}: metrics.csv of the {way} run differs from the cold run's")
  return seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("recipe", nargs="?", default="fedrep-fig3")
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", help="write the rows to this file")
  args = parser.parse_args()
  rows = []
  with tempfile.TemporaryDirectory() as work:
    for i in range(args.repeats):
      load = os.getloadavg()[0]
      seconds = repeat(args.recipe, args.quick, work)
      rows.append({"recipe": args.recipe, "quick": args.quick, "repeat": i, "load": load,
                   **{f"{way} s": s for way, s in seconds.items()}})
      print(f"repeat {i}: load {load:.2f}: " + ", ".join(
          f"{way} {s:.2f} s" for way, s in seconds.items()), flush=True)
  print(f"\n{args.recipe}{' --quick' if args.quick else ''}: seconds per run, "
        f"{args.repeats} repeats (metrics.csv byte-identical in every run)")
  print(f"{'way':<10} " + " ".join(f"{'#' + str(r['repeat']):>7}" for r in rows) +
        f" {'best':>7}")
  for way in ("floor", *WAYS):
    values = [r[f"{way} s"] for r in rows]
    print(f"{way:<10} " + " ".join(f"{v:7.2f}" for v in values) + f" {min(values):7.2f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
