"""Every recipe's `fedjax-rep run RECIPE --quick` as a first run: wall time, compiling, programs.

  python benchmarks/quick_recipes.py                          # every recipe, one run each
  python benchmarks/quick_recipes.py digits-personalized table1-synthetic --baseline f9f733c
  python benchmarks/quick_recipes.py --json quick.json
  python benchmarks/quick_recipes.py digits-personalized fedrep-fig3 --log tensorboard

Each recipe runs once in a new process with `--no-compile-cache` (every program traced and
compiled, as in a first run with an empty cache), timed whole, interpreter start included
(`recipe_time.run_seconds`). The table has its wall time, its compiling (tracing + lowering
+ XLA, from JAX's monitoring events: `recipe_time.compilation`) and that share of its wall
time, the number of programs compiled, and the load average just before it. With
`--baseline REV`, the package at git revision REV (`recipe_time.extract`) runs each recipe
right after this code does, in the same sitting; its columns follow, and the time of this
code over the baseline's. With `--flat-threefry`, each recipe also runs with that opt-in
(`fedjax_rep/core/threefry.py`) right after, in the same sitting; its columns follow: its
time, its compiling, its time over the default's, and whether its metrics.csv is byte-identical
to the default run's. `--log TRACKER` (repeatable) does the same with `--log TRACKER ...`
(the trackers' cost; experiments/tracking.py). With digits-personalized among the recipes
it runs first, and every recipe's time is also given over its time (the guard: each within
BOUND times it; the last line names those that are not). `--repeat N` reports each the run of median
time of N. `--keep DIR` keeps each run's metrics.csv, config.json and
figure in DIR/RECIPE. A run that fails is reported with its exit status (its own
message goes to stderr).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import recipe_time  # benchmarks/ is the script's directory

# Every recipe's --quick is kept within BOUND times REFERENCE's time in the same run
# (docs/benchmarks.md): the guard that a recipe's --quick has not grown unnoticed.
REFERENCE = "digits-personalized"
BOUND = 4.0


def recipe_names() -> list[str]:
  """The registered recipes, in `fedjax-rep list`'s order."""
  from fedjax_rep.experiments import recipe_registry
  return list(recipe_registry.all_recipes())


def first_run(recipe: str, work: str, package: str | None = None, flags=()) -> dict:
  """{seconds, compiling, share, programs, error, out} of one `RECIPE --quick
  --no-compile-cache [FLAGS]` run in a new directory `out` under `work`, by the installed
  package or the one in the directory `package`; error: None, or the exit status of a run
  that failed (its seconds NaN; its own error message went to stderr)."""
  out = tempfile.mkdtemp(dir=work, prefix=f"{recipe}-")
  try:
    seconds, events = recipe_time.run_seconds([recipe, "--quick", *flags], out,
                                              package=package)
    error = None
  except subprocess.CalledProcessError as failure:  # its error went to this stderr
    seconds, events, error = float("nan"), [], f"exit status {failure.returncode}"
  totals = recipe_time.compilation_totals(recipe_time.compilation(events))
  return {"seconds": seconds, "compiling": totals["compiling"],
          "share": totals["compiling"] / seconds, "programs": totals["compiled"],
          "error": error, "out": out}


def median_run(recipe: str, work: str, package: str | None = None, flags=(),
               repeat: int = 1) -> dict:
  """`first_run`'s row of the run of median time among `repeat` runs (the same settings)."""
  runs = sorted((first_run(recipe, work, package, flags) for _ in range(repeat)),
                key=lambda run: run["seconds"])
  return runs[len(runs) // 2]


def same_metrics(out_a: str, out_b: str) -> bool:
  """Whether the metrics.csv files of two run directories are byte-identical (False where
  either is missing)."""
  try:
    with open(os.path.join(out_a, "metrics.csv"), "rb") as a, \
        open(os.path.join(out_b, "metrics.csv"), "rb") as b:
      return a.read() == b.read()
  except OSError:
    return False


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("recipes", nargs="*", help="default: every recipe")
  parser.add_argument("--baseline", metavar="REV",
                      help="also run each recipe by the package at this git revision")
  parser.add_argument("--json", help="write the rows to this file")
  parser.add_argument("--flat-threefry", action="store_true",
                      help="also run each recipe with --flat-threefry")
  parser.add_argument("--log", action="append", default=[], metavar="TRACKER",
                      help="also run each recipe with --log TRACKER (repeatable: one run with "
                      "every TRACKER given)")
  parser.add_argument("--repeat", type=int, default=1, metavar="N",
                      help="run each recipe N times (each variant too) and report the run of "
                      "median time")
  parser.add_argument("--keep", metavar="DIR",
                      help="keep each run's outputs (this code's) in DIR/RECIPE")
  args = parser.parse_args()
  names = args.recipes or recipe_names()
  if REFERENCE in names:  # first: every other recipe's time is given over its
    names = [REFERENCE] + [name for name in names if name != REFERENCE]
  rows, reference = [], None
  header = (f"{'recipe':<24} {'load':>5} {'s':>7} {'compiling':>9} {'share':>6} {'programs':>8}"
            + (f" {'× ' + REFERENCE[:6]:>9}" if REFERENCE in names else ""))
  if args.baseline:
    header += f" | {'base s':>7} {'base comp.':>10} {'share':>6} {'programs':>8} {'ratio':>6}"
  variants = ([("flat", ["--flat-threefry"])] if args.flat_threefry else []) + (
      [("log", [flag for tracker in args.log for flag in ("--log", tracker)])] if args.log
      else [])
  for variant, _ in variants:
    header += f" | {variant + ' s':>7} {variant + ' comp.':>10} {'ratio':>6} {'same':>5}"
  print(header, flush=True)
  with tempfile.TemporaryDirectory() as work:
    baseline = None if args.baseline is None else recipe_time.extract(args.baseline, work)
    for name in names:
      row = {"recipe": name, "load": os.getloadavg()[0],
             **median_run(name, work, repeat=args.repeat)}
      if args.keep:
        shutil.copytree(row["out"], os.path.join(args.keep, name), dirs_exist_ok=True)
      line = (f"{name:<24} {row['load']:5.2f} {row['seconds']:7.1f} {row['compiling']:9.1f} "
              f"{100 * row['share']:5.0f}% {row['programs']:8d}")
      if REFERENCE in names:
        reference = row["seconds"] if name == REFERENCE else reference
        row["over reference"] = row["seconds"] / reference
        line += f" {row['over reference']:9.2f}"
      if baseline is not None:
        base = median_run(name, work, baseline, repeat=args.repeat)
        row.update({f"baseline {k}": v for k, v in base.items()},
                   baseline=args.baseline, ratio=row["seconds"] / base["seconds"])
        line += (f" | {base['seconds']:7.1f} {base['compiling']:10.1f} "
                 f"{100 * base['share']:5.0f}% {base['programs']:8d} {row['ratio']:6.2f}")
      for variant, flags in variants:
        other = median_run(name, work, flags=flags, repeat=args.repeat)
        row.update({f"{variant} {k}": v for k, v in other.items()},
                   **{f"{variant} ratio": other["seconds"] / row["seconds"],
                      f"{variant} same": same_metrics(row["out"], other["out"])})
        line += (f" | {other['seconds']:7.1f} {other['compiling']:10.1f} "
                 f"{row[variant + ' ratio']:6.2f} "
                 f"{'yes' if row[variant + ' same'] else 'NO':>5}")
      print(line, flush=True)
      for error in (row["error"], row.get("baseline error"),
                    *(row.get(f"{variant} error") for variant, _ in variants)):
        if error:
          print(f"  {name}: {error}", flush=True)
      rows.append(row)
  if reference is not None:
    over = [f"{r['recipe']} ({r['over reference']:.2f}×)" for r in rows
            if not r["over reference"] <= BOUND]
    print(f"over {BOUND:g}× {REFERENCE}'s time: {', '.join(over) or 'none'}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  sys.exit(main())
