"""The `fedjax-rep` command: `list` recipes, algorithms and datasets, `run` a recipe (over a
grid of settings with `--grid KEY=V1,V2,...`), check `data`, `compare` run directories."""

import argparse
import csv
import os
import shlex
import signal
import sys

from fedjax_rep.core import checkpoint
from fedjax_rep.core import files

DEFAULT_RECIPE = "fedrep-fig3"
WRITE_FAILED = 74  # exit status when a file or checkpoint cannot be written (EX_IOERR)


def _section(title: str, summaries: dict[str, str]) -> None:
  """Prints `title`, then one line per name with its summary, the summaries aligned two
  spaces after the longest name."""
  print(title)
  width = max(map(len, summaries), default=0) + 2
  for name, summary in summaries.items():
    print(f"  {name:<{width}}{summary}")


def _list(plugin_paths) -> None:
  """Prints the recipes, then each family's algorithms (those of the plugin files
  `plugin_paths` too), then the participation schedules, then the datasets."""
  from fedjax_rep import api  # noqa: F401  registers every family's algorithms
  from fedjax_rep.core.registry import ALGORITHMS
  from fedjax_rep.data.datasets import DATASETS
  from fedjax_rep.hetero.timed import SCHEDULES
  from fedjax_rep.experiments import plugins
  from fedjax_rep.experiments.recipe_registry import all_recipes
  plugins.load_all(plugin_paths)
  _section("recipes:", {name: recipe.summary for name, recipe in all_recipes().items()})
  for family, entries in ALGORITHMS.items():
    _section(f"{family} algorithms:", {name: entry.summary + _options_text(entry.options)
                                       for name, entry in entries.items()})
  _section("participation schedules on a simulated clock (wrap fedrep: hetero.timed):",
           SCHEDULES)
  _section("datasets (--set dataset=NAME: fedrep-table1-cifar10/cifar100, flute-table1, "
           "srpfl-neural, digits-personalized):",
           {name: entry.summary for name, entry in DATASETS.items()})


def _options_text(options) -> str:
  """' (options: NAME=DEFAULT, ...)' of the traced options an algorithm declares that a
  run may set (not those a recipe sets itself); empty where there are none."""
  default = lambda o: ("auto" if o.default is None else o.default if o.choices
                       else format(o.default, "g"))
  listed = [f"{o.name}={default(o)}" for o in options if not o.set_by_recipe]
  return f" (options: {', '.join(listed)})" if listed else ""


def _data() -> None:
  from fedjax_rep.data.catalog import rows
  for name, present, location, how in rows():
    print(f"{name:<10} {'present' if present else 'missing':<8} {location}"
          + (f"  get it: {how}" if how else ""))


def _plugin_argument(parser) -> None:
  parser.add_argument("--plugin", action="append", default=[], metavar="FILE",
                      help="a Python file that registers algorithms or datasets "
                      "(fr.register_algorithm, fr.register_dataset), imported first "
                      "(repeatable); its path and sha256 are recorded in config.json")


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="fedjax-rep", description=__doc__)
  commands = parser.add_subparsers(dest="command", required=True)
  listing = commands.add_parser("list", help="list recipes, algorithms and datasets, one line "
                                "each")
  _plugin_argument(listing)
  commands.add_parser("data", help="datasets: present or missing, where, how to get them")
  run = commands.add_parser(
      "run", help="run a recipe (every combination of its --grid) and write metrics.csv, "
      "config.json, PNG",
      epilog="example: fedjax-rep run fedrep-fig3 --quick --set num_clients=100 "
      "--grid lr=0.05,0.1 --grid samples_per_client=5,10 (4 combinations; keys that a "
      "recipe traces run as one compiled program)")
  run.add_argument("recipe", nargs="?", default=None,
                   help=f"recipe name (default: {DEFAULT_RECIPE}); see `fedjax-rep list`")
  run.add_argument("--quick", action="store_true", help="shrunk version that runs in seconds")
  _plugin_argument(run)
  run.add_argument("--seeds", type=int, default=None, help="number of seeds (run as one vmap)")
  run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a configuration field (repeatable, each key once; a list "
                   "field takes V1,V2,...; the grammar is in docs/cli.md)")
  run.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="sweep a configuration field over these values (repeatable: every "
                   "combination runs; a list field takes one value at a time); the swept "
                   "keys and a `grid` label are columns of metrics.csv, and the figure has "
                   "one line per combination")
  run.add_argument("--select", action="store_true",
                   help="choose, per algorithm, the --grid combination of the best validation "
                   "statistic (needs --set validation_fraction=F > 0; test numbers never enter "
                   "the choice) and write selection.csv and selection.png")
  run.add_argument("--confirm-seeds", type=int, default=None, metavar="N",
                   help="with --select: run each chosen combination again on N fresh seeds and "
                   "add its test statistic there to selection.csv")
  run.add_argument("--sample", action="append", default=[], metavar="KEY=DIST",
                   help="draw candidate values of a key the recipe sweeps in one program "
                   "from DIST: loguniform:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH or "
                   "choice:V1,V2,... (repeatable; --trials N points of a scrambled Sobol "
                   "sequence from the seed)")
  run.add_argument("--trials", type=int, default=None, metavar="N",
                   help="with --sample: the number of candidates drawn")
  run.add_argument("--search", choices=("halving", "hyperband"), default=None,
                   help="stop the candidates (--grid or --sample) early: successive halving "
                   "or Hyperband, each rung one program, ranked on validation (needs "
                   "validation_fraction > 0; implies --select); writes search.csv and "
                   "search.png")
  run.add_argument("--eta", type=int, default=3, metavar="ETA",
                   help="with --search: the 1/ETA of a rung's settings that continue "
                   "(default 3)")
  run.add_argument("--min-rounds", type=int, default=None, metavar="R",
                   help="with --search: the rounds of the shortest rung (default: "
                   "eval_every)")
  run.add_argument("--log", action="append", default=[], metavar="TRACKER",
                   choices=("tensorboard", "mlflow"),
                   help="also log the runs, as they compute, to TRACKER: tensorboard (event "
                   "files in OUT/tensorboard) or mlflow (OUT/mlflow.db); repeatable; needs "
                   "pip install '.[tracking]'; recorded in config.json, and --resume "
                   "continues the logs")
  run.add_argument("--out", default=None, help="output directory (default runs/RECIPE-<time>); "
                   "an existing one with the same configuration and grid is resumed")
  run.add_argument("--overwrite", action="store_true",
                   help="write into an --out that is not empty and not this run (its earlier "
                   "parts are deleted and the run starts over); a directory that another "
                   "run holds is refused all the same")
  run.add_argument("--resume", metavar="DIR",
                   help="continue the run in DIR (recipe, seeds, configuration and grid read "
                   "from DIR/config.json) from its last checkpoint; a complete run is left "
                   "as it is")
  run.add_argument("--from-config", metavar="PATH",
                   help="run again the run that wrote PATH (a config.json), into --out")
  run.add_argument("--checkpoint-every", type=int, metavar="ROUNDS",
                   help="also save a checkpoint inside a unit every ROUNDS rounds")
  run.add_argument("--checkpoint-seconds", type=float, default=checkpoint.DEFAULT_SECONDS,
                   metavar="S", help="save a checkpoint inside a unit at least every S "
                   f"seconds (default {checkpoint.DEFAULT_SECONDS:g}); Ctrl-C and SIGTERM "
                   "save one and stop")
  run.add_argument("--no-progress", action="store_true", help="hide the progress bars")
  run.add_argument("--no-compile-cache", action="store_true",
                   help="do not read or write the persistent compilation cache (default: on, "
                   "in $FEDJAX_REP_CACHE if set, else in $XDG_CACHE_HOME/fedjax_rep/jax, "
                   "$XDG_CACHE_HOME defaulting to ~/.cache)")
  run.add_argument("--flat-threefry", action="store_true",
                   help="opt-in: lower JAX's random-number hash on one flat axis on the CPU, "
                   "for every program this process compiles (the same numbers, shorter "
                   "compiling; recorded in config.json as code.threefry and "
                   "code.threefry_scope; fedjax_rep/core/threefry.py)")
  comparing = commands.add_parser(
      "compare", help="set runs side by side: the configuration keys that differ, their "
      "summary tables under those keys, and one figure of a metric, a panel per algorithm "
      "and a line per run (of a grid, the combination chosen on validation)",
      epilog="example: fedjax-rep compare runs/A runs/B --csv compare.csv")
  comparing.add_argument("dirs", nargs="+", metavar="DIR",
                         help="run directories (the --out of `fedjax-rep run`), two or more")
  comparing.add_argument("--csv", metavar="PATH", help="also write the table as CSV to PATH")
  comparing.add_argument("--figure", metavar="PATH", default="compare.png",
                         help="where to write the figure (PNG; default compare.png)")
  comparing.add_argument("--metric", metavar="NAME",
                         help="the metrics.csv column to draw against round (default: the "
                         "first of test_accuracy, model_error, test_error, ..., train_loss "
                         "that every run has)")
  comparing.add_argument("--all", action="store_true", dest="all_combinations",
                         help="of a run with a grid, draw and tabulate every combination "
                         "(default: each algorithm's combination chosen on validation, from "
                         "its selection.csv or else its summary's best val_accuracy)")
  return parser


def _what_to_run(args) -> tuple[str, dict]:
  """(recipe, run_to_dir's keywords quick, seeds, overrides, grid, out, plugins) from the
  command line, or from the config.json of --resume DIR (out = DIR) or --from-config PATH."""
  from fedjax_rep.experiments import runner
  from fedjax_rep.experiments.config import ConfigError
  if not (args.resume or args.from_config):
    name = args.recipe or DEFAULT_RECIPE
    return name, {"quick": args.quick, "seeds": args.seeds, "overrides": args.overrides,
                  "grid": args.grid, "out": args.out or runner.default_out(name),
                  "plugins": args.plugin, "select": args.select,
                  "confirm_seeds": args.confirm_seeds, "log": args.log,
                  "search": args.search, "eta": args.eta, "min_rounds": args.min_rounds,
                  "sample": args.sample, "trials": args.trials}
  option = "--resume" if args.resume else "--from-config"
  given = [flag for flag, value in (("a recipe name", args.recipe), ("--quick", args.quick),
                                    ("--seeds", args.seeds), ("--set", args.overrides),
                                    ("--grid", args.grid), ("--plugin", args.plugin),
                                    ("--select", args.select),
                                    ("--confirm-seeds", args.confirm_seeds is not None),
                                    ("--log", args.log), ("--sample", args.sample),
                                    ("--trials", args.trials is not None),
                                    ("--search", args.search), ("--eta", args.eta != 3),
                                    ("--min-rounds", args.min_rounds is not None),
                                    ("--from-config", args.resume and args.from_config),
                                    ("--out", args.resume and args.out)) if value]
  if given:
    raise ConfigError(f"{option} reads the recipe, seeds, configuration, grid, search, "
                      f"plugins and trackers from config.json: do not also give "
                      f"{', '.join(given)}")
  if args.resume:
    if not os.path.isfile(os.path.join(args.resume, "config.json")):
      problem = ("is not a run directory (no config.json in it)" if os.path.isdir(args.resume)
                 else "does not exist")
      raise ConfigError(f"--resume {args.resume} {problem}: give the --out directory of an "
                        f"earlier `fedjax-rep run`, or start a run in it with `fedjax-rep run "
                        f"RECIPE --out {shlex.quote(args.resume)}`")
    what = runner.replay(os.path.join(args.resume, "config.json"))
    return what.pop("name"), {**what, "out": args.resume}
  what = runner.replay(args.from_config)
  name = what.pop("name")
  return name, {**what, "out": args.out or runner.default_out(name)}


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  if args.command == "list":
    from fedjax_rep.experiments.config import ConfigError
    try:
      _list(args.plugin)
    except ConfigError as error:
      print(f"fedjax-rep: error: {error}", file=sys.stderr)
      return 2
    return 0
  if args.command == "data":
    _data()
    return 0
  if args.command == "compare":
    from fedjax_rep.experiments import compare
    from fedjax_rep.experiments import csv_tables
    from fedjax_rep.experiments.config import ConfigError
    try:
      result = compare.compare(args.dirs, csv_path=args.csv, figure_path=args.figure,
                               metric=args.metric, all_combinations=args.all_combinations)
    except ConfigError as error:
      print(f"fedjax-rep: error: {error}", file=sys.stderr)
      return 2
    except files.WriteError as error:
      print(f"fedjax-rep: error: {error}", file=sys.stderr)
      return WRITE_FAILED
    print(csv_tables.aligned(list(csv.reader(result.table.splitlines()))))
    print(f"wrote {', '.join(result.written)} ({result.metric} against round)")
    return 0
  import jax

  from fedjax_rep.core import compile_cache
  from fedjax_rep.core import distributed
  from fedjax_rep.core import threefry
  from fedjax_rep.data.missing import DataMissing
  from fedjax_rep.experiments import config as cfg
  from fedjax_rep.experiments import outputs
  from fedjax_rep.experiments import recipe_registry
  from fedjax_rep.experiments import runner
  what = {}
  try:
    if distributed.join() and not (args.resume or args.out):  # a job of several processes
      raise distributed.JobError("a job of several processes needs --out DIR (one directory "
                                 "every process sees) or --resume DIR")
    recipe, what = _what_to_run(args)
    finished = args.resume and outputs.complete(args.resume)
    if finished:
      if distributed.is_writer():  # process 0 of a job reports it
        print(f"fedjax-rep: {args.resume} holds a complete run ({', '.join(finished)}): "
              f"nothing to resume, nothing written; to run it again: fedjax-rep run "
              f"--from-config {shlex.quote(os.path.join(args.resume, 'config.json'))} "
              f"--out NEW")
      distributed.leave()
      return 0
    if args.no_compile_cache:
      compile_cache.disable()
    else:
      compile_cache.enable()
    if args.flat_threefry:
      threefry.use_flat()
    with checkpoint.stop_on_signals() as signals:
      out = runner.run_to_dir(
          recipe, **what, progress=not args.no_progress and distributed.is_writer(),
          overwrite=args.overwrite, checkpoint_rounds=args.checkpoint_every,
          checkpoint_seconds=args.checkpoint_seconds, stop=signals.requested)
  except (cfg.ConfigError, outputs.OutputError, DataMissing, compile_cache.CacheError,
          distributed.JobError, checkpoint.IdentityError) as error:
    print(f"fedjax-rep: error: {error}", file=sys.stderr)
    return 2
  except files.WriteError as error:
    out = shlex.quote(what.get("out", "DIR"))
    print(f"fedjax-rep: error: {error}; what ran before is saved in {out}: once it can be "
          f"written (e.g. with free space), resume with `fedjax-rep run --resume {out}`",
          file=sys.stderr)
    return WRITE_FAILED
  except jax.errors.JaxRuntimeError as error:
    if not distributed.in_job():
      raise
    # A collective failed: another process of the job died. End now, before the heartbeat
    # timeout makes the runtime abort this process with its own report.
    out = shlex.quote(what.get("out", "DIR"))
    print(f"fedjax-rep: error: process {jax.process_index()} of the job stopped: another "
          f"process stopped ({str(error).splitlines()[0][:200]}); what ran is saved in {out}; "
          f"resume the whole job with `fedjax-rep run --resume {out}` on every process",
          file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)
  except checkpoint.Interrupted as stop:
    where = f" after round {stop.round} of {stop.num_rounds} of a unit" if stop.round else ""
    print(f"fedjax-rep: stopped by {stop.signal_name}{where}; what ran is saved in "
          f"{what['out']}. Resume with:\n  fedjax-rep run --resume {shlex.quote(what['out'])}",
          file=sys.stderr)
    return 128 + getattr(signal, stop.signal_name, signal.SIGTERM)
  distributed.leave()
  if not distributed.is_writer():  # process 0 of the job reports what it wrote
    return 0
  tables = [name for name in (recipe_registry.get(recipe).summary_file, "selection.csv",
                               "selection.png", "search.csv", "search.png")
            if os.path.exists(os.path.join(out, name))]
  searched = "search.csv" in tables  # its summary: mostly stopped candidates, left in the file
  for name in tables:
    if name.endswith(".csv") and name != "search.csv" and not (
        searched and name == recipe_registry.get(recipe).summary_file):
      _print_table(os.path.join(out, name))
  print(f"wrote {out}/metrics.csv, config.json, {recipe}.png"
        + "".join(f", {name}" for name in tables))
  for line in _log_lines(out):
    print(line)
  return 0


def _log_lines(out: str) -> list[str]:
  """How to look at the trackers' logs in the run directory `out`, one line per tracker
  that wrote there."""
  lines = []
  if os.path.isdir(os.path.join(out, "tensorboard")):
    lines.append(f"logged to TensorBoard: tensorboard --logdir "
                 f"{shlex.quote(os.path.join(out, 'tensorboard'))}")
  if os.path.exists(os.path.join(out, "mlflow.db")):
    uri = "sqlite:///" + os.path.abspath(os.path.join(out, "mlflow.db"))
    lines.append(f"logged to MLflow: mlflow ui --backend-store-uri {shlex.quote(uri)}")
  return lines


def _print_table(path: str) -> None:
  """Prints the CSV file `path` as aligned columns."""
  from fedjax_rep.experiments import csv_tables
  with open(path) as f:
    table = list(csv.reader(f))
  print(csv_tables.aligned(table))


def _needs_supervisor() -> bool:
  """Whether this is `fedjax-rep run` started as a process of a job (not the supervisor's
  child): it runs under `supervisor`."""
  from fedjax_rep import supervisor
  if sys.argv[1:2] != ["run"] or supervisor.supervised():
    return False
  from fedjax_rep.core import distributed  # imports jax: not for the other commands
  try:
    return distributed.job_environment() is not None
  except distributed.JobError:
    return False  # main reports it


def command() -> None:
  """The `fedjax-rep` console script: `main()` (a process of a job runs it in a child under
  `supervisor`), then an immediate exit with its code once stdout and stderr are flushed.
  Everything a run writes is written and closed by then; the interpreter's teardown of jax
  and XLA would only delay the shell."""
  from fedjax_rep import supervisor
  if supervisor.supervised():
    supervisor.follow_supervisor()
  if _needs_supervisor():
    code = supervisor.run(sys.argv[1:])
  else:
    code = main()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


if __name__ == "__main__":
  command()
