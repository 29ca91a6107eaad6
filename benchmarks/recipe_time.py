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

Where a run's time goes: every run records JAX's compilation events (`jax.monitoring`), and
the script prints, for the first repeat's runs, the seconds spent tracing the programs that
were lowered, lowering them to MLIR and compiling them with XLA (in a warm run: loading them
from the cache), their share of the run's wall time (the rest is the interpreter and
imports, data, rounds, evaluation and the figure), how many programs were lowered, and the
programs that cost most. `--json` rows carry the totals per way (e.g. "cold compiling").

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
TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE = "/jax/core/compile/backend_compile_duration"
# `python -m fedjax_rep ...` (what the package of any revision runs as its command) with a
# listener that writes each of JAX's duration events to $RECIPE_TIME_EVENTS as it comes, a
# JSON line [event, program name, seconds] (the command may end with os._exit).
DRIVER = """\
import json, os, runpy
import jax
events = open(os.environ["RECIPE_TIME_EVENTS"], "w", buffering=1)
jax.monitoring.register_event_duration_secs_listener(lambda event, seconds, **kw: events.write(
    json.dumps([event, kw.get("fun_name", ""), seconds]) + "\\n"))
runpy.run_module("fedjax_rep", run_name="__main__", alter_sys=True)
"""


def run_seconds(args: list[str], out: str, cache: str | None = None,
                package: str | None = None) -> tuple[float, list]:
  """(seconds, JAX's duration events) of one `fedjax-rep run ARGS --no-progress --out OUT`
  process, interpreter start included: with the compilation cache in the directory
  `cache`, or with none (`--no-compile-cache`) when cache is None; the fedjax_rep package
  found in the directory `package` when given (first on PYTHONPATH), else the installed
  one. Events: [(event name, program name, seconds)] in the order JAX reported them."""
  out = os.path.abspath(out)
  events_file = out + ".events"  # beside the run: the command wants its --out empty
  command = [sys.executable, "-c", DRIVER, "run", *args, "--no-progress", "--out", out,
             *(["--no-compile-cache"] if cache is None else [])]
  env = {**os.environ, "RECIPE_TIME_EVENTS": events_file,
         **({} if cache is None else {"FEDJAX_REP_CACHE": cache})}
  if package is not None:
    env["PYTHONPATH"] = os.pathsep.join([package, *filter(None, [os.environ.get("PYTHONPATH")])])
  os.makedirs(out, exist_ok=True)  # the run's working directory: `python -c` puts it first
  start = time.perf_counter()       # on sys.path, and a checkout there would be imported
  subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env, cwd=out)
  seconds = time.perf_counter() - start
  with open(events_file) as f:
    return seconds, [json.loads(line) for line in f]


def compilation(events: list) -> dict:
  """{program name: {"lowered", "compiled": counts, "trace", "lower", "xla": seconds}} of
  one run's events. A program's trace is the last trace event before its lowering: the
  traces of the jitted functions it calls come earlier and are part of it (traces that are
  not lowered, e.g. of shapes only, are left out)."""
  programs, last_trace = {}, 0.0
  for event, name, seconds in events:
    if event == TRACE:
      last_trace = seconds
    elif event in (LOWER, COMPILE):
      entry = programs.setdefault(name, {"lowered": 0, "compiled": 0, "trace": 0.0,
                                         "lower": 0.0, "xla": 0.0})
      if event == LOWER:
        entry["lowered"] += 1
        entry["trace"] += last_trace
        entry["lower"] += seconds
        last_trace = 0.0
      else:
        entry["compiled"] += 1
        entry["xla"] += seconds
  return programs


def compilation_totals(programs: dict) -> dict:
  """The sums over `compilation`'s programs: counts and seconds, and "compiling" (trace +
  lower + xla seconds)."""
  totals = {key: sum(p[key] for p in programs.values())
            for key in ("lowered", "compiled", "trace", "lower", "xla")}
  return {**totals, "compiling": totals["trace"] + totals["lower"] + totals["xla"]}


def print_compilation(label: str, seconds: float, programs: dict, top: int = 8) -> None:
  """Prints a run's compilation totals, their share of its `seconds`, and its `top`
  costliest programs."""
  t = compilation_totals(programs)
  print(f"\n{label}: {seconds:.2f} s; compiling {t['compiling']:.2f} s "
        f"({100 * t['compiling'] / seconds:.0f} %): tracing {t['trace']:.2f}, lowering "
        f"{t['lower']:.2f}, XLA {t['xla']:.2f}; {t['lowered']} programs lowered, "
        f"{t['compiled']} through XLA (compiled, or loaded from the cache)")
  print(f"  {'program':<44} {'lowered':>7} {'XLA':>5} {'trace s':>8} {'lower s':>8} "
        f"{'XLA s':>8}")
  costliest = sorted(programs.items(), key=lambda item: -(item[1]["trace"] + item[1]["lower"]
                                                         + item[1]["xla"]))
  for name, p in costliest[:top]:
    print(f"  {name[:44]:<44} {p['lowered']:>7} {p['compiled']:>5} {p['trace']:8.2f} "
          f"{p['lower']:8.2f} {p['xla']:8.2f}")


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
  """({way: seconds}, {way: `compilation` of its events}, differences): each way (module
  docstring) from a new cache directory under `work`, and the floor's seconds
  (`floor_seconds`); with `baseline` (a package directory, see `extract`), also its cold
  run ("baseline"), and its metrics.csv's (absolute, relative) differences from this
  code's (`differences`, else None)."""
  cache = tempfile.mkdtemp(dir=work, prefix="cache-")
  seconds, outputs, programs = {"floor": floor_seconds()}, {}, {}
  for way in WAYS:
    outputs[way] = tempfile.mkdtemp(dir=work, prefix="run-")
    seconds[way], events = run_seconds([recipe] + ["--quick"] * quick, outputs[way],
                                       None if way == "no cache" else cache)
    programs[way] = compilation(events)
    with open(os.path.join(outputs[way], "metrics.csv"), "rb") as f, \
        open(os.path.join(outputs["cold"], "metrics.csv"), "rb") as g:
      if f.read() != g.read():
        sys.exit(f"{recipe}: metrics.csv of the {way} run differs from the cold run's")
  if baseline is None:
    return seconds, programs, None
  out = tempfile.mkdtemp(dir=work, prefix="baseline-run-")
  seconds["baseline"], events = run_seconds([recipe] + ["--quick"] * quick, out,
                                            tempfile.mkdtemp(dir=work, prefix="cache-"),
                                            baseline)
  programs["baseline"] = compilation(events)
  return seconds, programs, differences(os.path.join(outputs["cold"], "metrics.csv"),
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
      seconds, programs, diff = repeat(args.recipe, args.quick, work, baseline)
      rows.append({"recipe": args.recipe, "quick": args.quick, "repeat": i, "load": load,
                   **{f"{way} s": s for way, s in seconds.items()},
                   "warm over floor": seconds["warm"] / seconds["floor"],
                   **{f"{way} {key}": value for way, p in programs.items()
                      for key, value in compilation_totals(p).items()}})
      if i == 0:
        first = seconds, programs
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
  seconds, programs = first
  for way, p in programs.items():
    print_compilation(f"repeat 0, {way}", seconds[way], p)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
