"""A sweep as one program vs the same runs one at a time: fedrep-fig3 --quick over seeds x lr.

  python benchmarks/sweep.py                      # 32 seeds x lr in {0.1, 0.3, 1}
  python benchmarks/sweep.py --seeds 4 --lrs 0.1,1 --processes 2 --json out.json

Four ways to get the same curves, each timed from a new process (import and compilation
included):
  grid, command line       `fedjax-rep run fedrep-fig3 --quick --seeds S --grid lr=...`
                           (every seed, lr, algorithm and n in one vmapped program), with
                           metrics.csv and the figure written;
  processes, command line  one `fedjax-rep run ... --seeds 1 --set lr=.. --set seed=..` per
                           (seed, lr), each compiling (persistent cache off, as on a new
                           machine): timed on --processes of them, extrapolated to S x L;
  processes, stored        the same with the compilation cache on (a new cache directory):
                           the first process compiles and stores the programs, the others
                           load them (JAX's persistent cache); the first plus the mean of
                           --processes more, extrapolated to the other S x L - 1;
  grid, API                `fr.run_recipe(..., grid={"lr": [...]})` (no files);
  singles, API             one process calling `fr.run_recipe(..., seeds=1)` per (seed, lr):
                           compiled once, then reused from memory.
The grid's curves are compared with the single runs' (float32 round-off, amplified where a
step size is unstable).
"""

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np
from recipe_time import run_seconds  # benchmarks/ is the script's directory

RECIPE = "fedrep-fig3"


def cli(args, out, cache=None):
  """Seconds of one `fedjax-rep run RECIPE --quick ARGS` process (`run_seconds`)."""
  return run_seconds([RECIPE, "--quick", *args], out, cache)


API_SCRIPT = """
import sys, time, pickle
start = time.perf_counter()
import fedjax_rep as fr
seeds, lrs = int(sys.argv[1]), [float(v) for v in sys.argv[2].split(",")]
mode, path = sys.argv[3], sys.argv[4]
if mode == "grid":
  rows = fr.run_recipe("fedrep-fig3", quick=True, seeds=seeds, progress=False, grid={"lr": lrs})[0]
else:
  rows = {(lr, seed): fr.run_recipe("fedrep-fig3", quick=True, seeds=1, progress=False,
                                    overrides=[f"lr={lr}", f"seed={seed}"])[0]
          for lr in lrs for seed in range(seeds)}
seconds = time.perf_counter() - start
with open(path, "wb") as f:
  pickle.dump((seconds, rows), f)
"""


def api(seeds, lrs, mode, work):
  """(seconds, rows) of one new process calling the Python API (import and compilation
  included): mode 'grid' (one call with grid=) or 'singles' (one call per (seed, lr))."""
  path = os.path.join(work, mode + ".pickle")
  subprocess.run([sys.executable, "-c", API_SCRIPT, str(seeds), ",".join(map(str, lrs)), mode,
                  path], check=True)
  with open(path, "rb") as f:
    return pickle.load(f)


def largest_difference(grid_csv, singles):
  """{'max', 'over', 'runs', 'min_lr'}: the largest |difference| of principal_angle between
  a run's curve in the grid and its single run, how many runs (algorithm x n x seed x lr)
  differ by more than 1e-4, and the smallest lr among those (unstable step sizes amplify
  float32 round-off: the vmapped programs differ in batch size)."""
  import csv
  with open(grid_csv) as f:
    grid = [r for r in csv.DictReader(f)]
  by_run = {}
  for r in grid:
    by_run.setdefault((float(r["lr"]), int(r["seed"]), r["algorithm"], int(r["num_clients"])),
                      []).append(float(r["principal_angle"]))
  worst, over, lrs = 0.0, 0, []
  for (lr, seed), rows in singles.items():
    single = {}
    for r in rows:
      single.setdefault((r["algorithm"], r["num_clients"]), []).append(r["principal_angle"])
    for (name, n), curve in single.items():
      gap = float(np.nanmax(np.abs(np.array(by_run[lr, seed, name, n]) - np.array(curve))))
      worst = max(worst, gap)
      if gap > 1e-4:
        over += 1
        lrs.append(lr)
  return {"max": worst, "over": over, "runs": len(by_run), "min_lr": min(lrs, default=None)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seeds", type=int, default=32)
  parser.add_argument("--lrs", default="0.1,0.3,1")
  parser.add_argument("--processes", type=int, default=3,
                      help="single-run processes to time (extrapolated to all runs)")
  parser.add_argument("--json", help="write the results to this file")
  args = parser.parse_args()
  lrs = [float(v) for v in args.lrs.split(",")]
  runs = args.seeds * len(lrs)
  work = tempfile.mkdtemp()
  grid_s = cli(["--seeds", str(args.seeds), "--grid", "lr=" + args.lrs],
               os.path.join(work, "grid"))
  def single(i, cache=None):
    return cli(["--seeds", "1", "--set", f"lr={lrs[i % len(lrs)]}", "--set", f"seed={i}"],
               os.path.join(work, f"single{i}-{cache is not None}"), cache)

  single_s = [single(i) for i in range(args.processes)]
  cache = os.path.join(work, "cache")
  stored_s = [single(i, cache) for i in range(args.processes + 1)]  # the first one compiles
  grid_api_s, _ = api(args.seeds, lrs, "grid", work)
  api_s, singles = api(args.seeds, lrs, "singles", work)
  difference = largest_difference(os.path.join(work, "grid", "metrics.csv"), singles)
  processes_s = float(np.mean(single_s)) * runs
  stored_processes_s = stored_s[0] + float(np.mean(stored_s[1:])) * (runs - 1)
  load = os.getloadavg()[0]
  print(f"{RECIPE} --quick: {args.seeds} seeds x lr in {lrs} = {runs} runs "
        f"(load average {load:.1f} on {os.cpu_count()} cores)")
  print(f"{'way':<28} {'seconds':>9} {'/ grid':>7}")
  for name, seconds, base in (("grid, command line", grid_s, grid_s),
                              ("processes, command line", processes_s, grid_s),
                              ("processes, stored programs", stored_processes_s, grid_s),
                              ("grid, API", grid_api_s, grid_api_s),
                              ("singles in one process, API", api_s, grid_api_s)):
    print(f"{name:<28} {seconds:>9.1f} {seconds / base:>7.1f}")
  print(f"processes: {np.mean(single_s):.1f} s per run, timed on {args.processes}, "
        f"extrapolated to {runs}; with stored programs: the first {stored_s[0]:.1f} s, then "
        f"{np.mean(stored_s[1:]):.1f} s per run")
  print(f"largest difference of a curve (principal angle), grid vs single run: "
        f"{difference['max']:.1e}; runs differing by more than 1e-4: {difference['over']} of "
        f"{difference['runs']}" + (f" (all at lr >= {difference['min_lr']})"
                                   if difference["over"] else ""))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"runs": runs, "grid_cli_s": grid_s, "processes_cli_s": processes_s,
                 "single_process_s": single_s, "stored_processes_cli_s": stored_processes_s,
                 "stored_process_s": stored_s, "grid_api_s": grid_api_s,
                 "singles_api_s": api_s, "difference": difference, "load": load}, f,
                indent=2)


if __name__ == "__main__":
  main()
