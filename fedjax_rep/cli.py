"""The `fedjax-rep` command: `list` recipes and algorithms, `run` a recipe (over a grid of
settings with `--grid KEY=V1,V2,...`), check `data`."""

import argparse
import csv
import os
import sys

DEFAULT_RECIPE = "fedrep-fig3"


def _list() -> None:
  import fedjax_rep  # noqa: F401  registers every family's algorithms
  from fedjax_rep.core.registry import ALGORITHMS
  from fedjax_rep.hetero.timed import SCHEDULES
  from fedjax_rep.recipes import RECIPES
  print("recipes:")
  for name, recipe in RECIPES.items():
    print(f"  {name:<20} {recipe.summary}")
  for family, entries in ALGORITHMS.items():
    print(f"{family} algorithms:")
    for name, entry in entries.items():
      print(f"  {name:<20} {entry.summary}")
  print("participation schedules on a simulated clock (wrap fedrep: hetero.timed):")
  for name, summary in SCHEDULES.items():
    print(f"  {name:<20} {summary}")


def _data() -> None:
  from fedjax_rep.data.catalog import rows
  for name, present, location, how in rows():
    print(f"{name:<10} {'present' if present else 'missing':<8} {location}"
          + (f"  get it: {how}" if how else ""))


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="fedjax-rep", description=__doc__)
  commands = parser.add_subparsers(dest="command", required=True)
  commands.add_parser("list", help="list recipes and algorithms, one line each")
  commands.add_parser("data", help="datasets: present or missing, where, how to get them")
  run = commands.add_parser(
      "run", help="run a recipe (every combination of its --grid) and write metrics.csv, "
      "config.json, PNG",
      epilog="example: fedjax-rep run fedrep-fig3 --quick --set num_clients=100 "
      "--grid lr=0.05,0.1 --grid samples_per_client=5,10 (4 combinations; keys that a "
      "recipe traces run as one compiled program)")
  run.add_argument("recipe", nargs="?", default=DEFAULT_RECIPE,
                   help=f"recipe name (default: {DEFAULT_RECIPE}); see `fedjax-rep list`")
  run.add_argument("--quick", action="store_true", help="shrunk version that runs in seconds")
  run.add_argument("--seeds", type=int, default=None, help="number of seeds (run as one vmap)")
  run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a configuration field (repeatable)")
  run.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="sweep a configuration field over these values (repeatable: every "
                   "combination runs; a list field takes one value at a time); the swept "
                   "keys and a `grid` label are columns of metrics.csv, and the figure has "
                   "one line per combination")
  run.add_argument("--out", default=None, help="output directory (default runs/RECIPE-<time>); "
                   "an existing one with the same configuration and grid is resumed")
  run.add_argument("--no-progress", action="store_true", help="hide the progress bars")
  run.add_argument("--no-compile-cache", action="store_true",
                   help="do not read or write the persistent compilation cache (default: on, "
                   "in $FEDJAX_REP_CACHE or ~/.cache/fedjax_rep/jax)")
  return parser


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  if args.command == "list":
    _list()
    return 0
  if args.command == "data":
    _data()
    return 0
  from fedjax_rep.core import compile_cache
  from fedjax_rep.data.missing import DataMissing
  from fedjax_rep.recipes import config as cfg
  from fedjax_rep.recipes import registry
  try:
    if not args.no_compile_cache:
      compile_cache.enable()
    out = registry.run_to_dir(args.recipe, quick=args.quick, seeds=args.seeds,
                              overrides=args.overrides, grid=args.grid, out=args.out,
                              progress=not args.no_progress)
  except (cfg.ConfigError, FileExistsError, DataMissing, compile_cache.CacheError) as error:
    print(f"fedjax-rep: error: {error}", file=sys.stderr)
    return 2
  summary = os.path.join(out, registry.get(args.recipe).summary_file)
  if os.path.exists(summary):
    with open(summary) as f:
      table = list(csv.reader(f))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
      print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
  print(f"wrote {out}/metrics.csv, config.json, {args.recipe}.png"
        + (f", {os.path.basename(summary)}" if os.path.exists(summary) else ""))
  return 0


if __name__ == "__main__":
  sys.exit(main())
