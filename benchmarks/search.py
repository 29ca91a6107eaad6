"""Successive halving against the full grid: time, client-epochs and the setting each chooses.

  python benchmarks/search.py --json /tmp/search.json
  python benchmarks/search.py --eta 2 --seeds 3 --confirm-seeds 5
  python benchmarks/search.py --clients 10 --rounds 4 --eval-every 1 --seeds 1 \\
      --confirm-seeds 1 --eta 2 --lr 0.03 0.1 --momentum 0 0.9 --weight-decay 0   # a smoke test

The problem: `digits-personalized --quick` (digits over --clients (50) clients with 2 class
shards each, participation 0.1, --rounds (40) rounds evaluated every --eval-every (5), the
MLP; FedRep: 10 head epochs then 1 body epoch a round, FedAvg: 1 epoch, batch 10) with
--algorithms (fedrep fedavg), validation_fraction 0.2 and --seeds (2) seeds, over the
candidates lr in --lr (0.01 0.03 0.1) x momentum in --momentum (0 0.5 0.9) x weight_decay in
--weight-decay (0 0.0001 0.001): 27 points. Two ways to choose a setting per algorithm,
both `experiments.runner.run_to_dir` into a fresh temporary directory:
  grid     `select=True`: every candidate runs to the last round; selection.csv chooses
           by validation accuracy (the recipe's statistic: the mean of the last 10
           evaluations, averaged over seeds);
  halving  `search="halving", eta=--eta`: successive halving over the same candidates
           (`experiments.search`: each rung ranks by validation accuracy, keeps 1/eta and
           continues the survivors from their state), selection.csv the same way.
Measured in this one process:
  warm-up       first, each variant once as timed below, then the confirmation of a
                choice: it compiles every program the timed runs use (the grid's settings
                one per call on the CPU, `batch.WIDTHS`; the search's rungs one program of
                their settings each: 27, 9, ... wide; the confirmations' of --confirm-seeds
                runs); the programs compiled during each timed run and during the
                confirmations are counted (JAX's backend_compile events) and printed, 0
                where the warm-up covered them;
  seconds       then each variant once, grid first: the wall seconds of its `run_to_dir`
                call (data, training, evaluation, the per-setting cost columns, writing
                metrics.csv, selection.csv, search.csv and the figures), without
                confirmation; of which "training" is the time inside `core.loop.run` (the
                rounds and evaluations) and "cost" inside `nn.cost.communication` (traced
                once per algorithm and setting for the upload/download columns);
  client-epochs per algorithm, from the variant's metrics.csv: the sum over (setting, seed)
                of the rounds it computed (a finite train_loss, or a diverged run's rounds:
                it still computes them; a setting the search stopped has NaN after its
                stop) x the cohort (`core.cohort.cohort_size`: participation x clients) x
                the epochs per round (fedrep: head_epochs + local_epochs; fedavg:
                local_epochs);
  choice        selection.csv's chosen setting per algorithm and its validation accuracy;
  confirmation  each chosen setting rerun on --confirm-seeds (3) fresh seeds (those after
                the search's: seed = base + --seeds, as `run_to_dir(confirm_seeds=...)`
                runs them) by `runner.run`, every algorithm in it (one program, as the
                search ran them; where --confirm-seeds equals --seeds, the search's), and
                the recipe's summary of those runs: per algorithm that chose the setting,
                its test accuracy, mean +- std over the seeds (one run per setting: where
                both variants chose the same, the numbers are the same).
Ratios halving / grid of seconds and client-epochs are of this one run. Per algorithm the
check "the confirmed test accuracy of halving's choice is within max(1 point, the seed
spread: the larger std over the confirm seeds of the two choices) of the grid's choice" is
printed PASS (PASS (above) where halving's is better by more) or FAIL, never asserted.
The load averages are printed at the start and the end and recorded with each variant;
--json writes everything with the machine.
"""

import argparse
import contextlib
import csv
import math
import os
import shutil
import tempfile
import time

import jax

# benchmarks/ is the script's directory
from linear_round import check_positive, machine_info, now, peak_rss_bytes, report

NAME = "digits-personalized"
ALGORITHMS = ("fedrep", "fedavg")
LRS = (0.01, 0.03, 0.1)
MOMENTA = (0.0, 0.5, 0.9)
WEIGHT_DECAYS = (0.0, 0.0001, 0.001)
KEYS = ("lr", "momentum", "weight_decay")
VALIDATION_FRACTION = 0.2
VARIANTS = ("grid", "halving")
POINT = 0.01  # one point of accuracy
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_compiles = []  # one entry per backend compile in this process, once `_listen` has run


def _listen() -> None:
  """Counts this process's backend compiles into `_compiles` (registered once)."""
  if not getattr(_listen, "done", False):
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: _compiles.append(seconds)
        if event == COMPILE_EVENT else None)
    _listen.done = True


def epochs_per_round(algorithm: str, config) -> int:
  """The local epochs a sampled client trains per round: fedrep head_epochs +
  local_epochs, fedavg local_epochs."""
  if algorithm == "fedrep":
    return config.head_epochs + config.local_epochs
  return config.local_epochs


def overrides(args, algorithms=None) -> list[str]:
  """The --set items of the problem (the recipe's --quick, then these; `algorithms` in
  place of args')."""
  return [f"num_clients={args.clients}", f"rounds={args.rounds}",
          f"eval_every={args.eval_every}", f"validation_fraction={VALIDATION_FRACTION}",
          f"algorithms={','.join(algorithms or args.algorithms)}"]


def grid(args) -> list[str]:
  """The --grid items of the candidates."""
  return [f"{key}={','.join(map(str, values))}" for key, values in
          (("lr", args.lr), ("momentum", args.momentum), ("weight_decay", args.weight_decay))]


def config(args):
  """The resolved configuration of the problem (no grid)."""
  from fedjax_rep.experiments import recipe_registry
  return recipe_registry.resolve(NAME, quick=True, overrides=overrides(args))


def variant_keywords(variant: str, args) -> dict:
  """`run_to_dir`'s keywords that make `variant`."""
  return {"select": True} if variant == "grid" else {"search": "halving", "eta": args.eta}


def number(text) -> float:
  """A metrics.csv cell as a float (NaN for '' or unparsable)."""
  try:
    return float(text)
  except (TypeError, ValueError):
    return math.nan


def read_csv(path: str) -> list[dict]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def computed_rounds(metrics: list[dict]) -> dict[str, int]:
  """{algorithm: the rounds computed over every (setting, seed)} of metrics.csv rows: those
  with a finite train_loss, or of a diverged run (diverged = 1: it computes on, NaN)."""
  out = {}
  for row in metrics:
    ran = math.isfinite(number(row.get("train_loss"))) or number(row.get("diverged")) == 1
    out[row["algorithm"]] = out.get(row["algorithm"], 0) + int(ran)
  return out


def client_epochs(metrics: list[dict], conf) -> dict[str, dict]:
  """{algorithm: {rounds, cohort, epochs_per_round, client_epochs}} of metrics.csv rows
  (`computed_rounds` x cohort x epochs per round)."""
  from fedjax_rep.core.cohort import cohort_size
  cohort = cohort_size(conf.num_clients, conf.participation)
  out = {}
  for algorithm, rounds in computed_rounds(metrics).items():
    epochs = epochs_per_round(algorithm, conf)
    out[algorithm] = {"rounds": rounds, "cohort": cohort, "epochs_per_round": epochs,
                      "client_epochs": rounds * cohort * epochs}
  return out


@contextlib.contextmanager
def timed(module, attribute: str, totals: dict, name: str):
  """module.attribute wrapped so that the seconds inside its calls add to totals[name]
  while the context lasts (as is where the module lacks it)."""
  original = getattr(module, attribute, None)
  if original is None:
    yield
    return

  def wrapper(*args, **kwargs):
    start = time.perf_counter()
    try:
      return original(*args, **kwargs)
    finally:
      totals[name] += time.perf_counter() - start

  setattr(module, attribute, wrapper)
  try:
    yield
  finally:
    setattr(module, attribute, original)


def run_variant(variant: str, args) -> dict:
  """`variant`'s `run_to_dir` into a fresh temporary directory, timed: {seconds,
  training_seconds, cost_seconds, compiles, metrics (metrics.csv rows), selection
  (selection.csv rows), search (search.csv rows, halving), load (1, 5, 15 min) before and
  after}."""
  from fedjax_rep.core import loop
  from fedjax_rep.experiments import runner
  from fedjax_rep.nn import cost
  given = {"quick": True, "seeds": args.seeds, "overrides": overrides(args),
           "grid": grid(args), "progress": False, **variant_keywords(variant, args)}
  totals = {"training": 0.0, "cost": 0.0}
  directory = tempfile.mkdtemp(prefix=f"search-{variant}-")
  try:
    load_before = list(os.getloadavg())
    compiled = len(_compiles)
    with timed(loop, "run", totals, "training"), timed(cost, "communication", totals, "cost"):
      start = time.perf_counter()
      out = runner.run_to_dir(NAME, out=os.path.join(directory, "run"), **given)
      seconds = time.perf_counter() - start
    result = {"seconds": seconds, "training_seconds": totals["training"],
              "cost_seconds": totals["cost"], "compiles": len(_compiles) - compiled,
              "load_before": load_before, "load": list(os.getloadavg()),
              "metrics": read_csv(os.path.join(out, "metrics.csv")),
              "selection": read_csv(os.path.join(out, "selection.csv"))}
    if os.path.exists(os.path.join(out, "search.csv")):
      result["search"] = read_csv(os.path.join(out, "search.csv"))
    return result
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def confirm(args, choice: dict, base_seed: int) -> dict:
  """The chosen setting `choice` (a selection.csv row) run again with every algorithm on
  --confirm-seeds fresh seeds (from base_seed + --seeds) for --rounds rounds by
  `runner.run`: {algorithm: {test_accuracy, test_accuracy_std_over_seeds (over those
  seeds), seeds, first_seed, diverged, seconds (of the run of every algorithm)}}."""
  from fedjax_rep.experiments import recipe_registry, runner
  items = [*overrides(args), *(f"{key}={choice[key]}" for key in KEYS),
           f"seed={base_seed + args.seeds}"]
  start = time.perf_counter()
  rows, conf = runner.run(NAME, quick=True, seeds=args.confirm_seeds, overrides=items,
                          progress=False)
  seconds = time.perf_counter() - start
  return {entry["algorithm"]: {
      "test_accuracy": float(entry["test_accuracy"]),
      "test_accuracy_std_over_seeds": float(entry["test_accuracy_std_over_seeds"]),
      "seeds": args.confirm_seeds, "first_seed": base_seed + args.seeds,
      "diverged": int(entry.get("diverged", 0) or 0), "seconds": seconds}
      for entry in recipe_registry.get(NAME).summarize(rows, conf)}


def check(grid_confirmed: dict, halving_confirmed: dict) -> dict:
  """{difference (halving - grid), tolerance (max(1 point, the larger std over the confirm
  seeds)), outcome: PASS, PASS (above) or FAIL}."""
  difference = halving_confirmed["test_accuracy"] - grid_confirmed["test_accuracy"]
  tolerance = max(POINT, grid_confirmed["test_accuracy_std_over_seeds"],
                  halving_confirmed["test_accuracy_std_over_seeds"])
  outcome = ("PASS" if abs(difference) <= tolerance else
             "PASS (above)" if difference > 0 else "FAIL")
  return {"difference": difference, "tolerance": tolerance, "outcome": outcome}


def schedule(args, count: int) -> list[tuple[int, int]]:
  """Successive halving's rungs over `count` candidates: [(settings, last round), ...]."""
  from fedjax_rep.experiments import search
  return search.halving(count, args.rounds, args.eval_every, args.eta, args.eval_every)


def measure(args) -> dict:
  """Everything: the warm-up, both variants timed, their choices confirmed, the checks."""
  conf = config(args)
  candidates = len(args.lr) * len(args.momentum) * len(args.weight_decay)
  result = {"recipe": f"{NAME} --quick", "algorithms": list(args.algorithms),
            "clients": args.clients, "participation": conf.participation,
            "rounds": args.rounds, "eval_every": args.eval_every, "seeds": args.seeds,
            "confirm_seeds": args.confirm_seeds, "eta": args.eta,
            "validation_fraction": VALIDATION_FRACTION,
            "candidates": {"lr": args.lr, "momentum": args.momentum,
                           "weight_decay": args.weight_decay, "count": candidates},
            "halving_rungs": [list(r) for r in schedule(args, candidates)],
            "backend": jax.default_backend(), "machine": machine_info(),
            "load_start": list(os.getloadavg())}
  start = time.perf_counter()
  compiled = len(_compiles)
  for variant in VARIANTS:
    warm = run_variant(variant, args)
  confirm(args, warm["selection"][0], conf.seed)
  result["warm_up"] = {"seconds": time.perf_counter() - start,
                       "compiles": len(_compiles) - compiled}
  print(f"warm-up: {result['warm_up']['seconds']:.1f} s, {result['warm_up']['compiles']} "
        f"programs compiled; load {os.getloadavg()[0]:.2f}", flush=True)
  runs = {}
  for variant in VARIANTS:
    runs[variant] = run_variant(variant, args)
    print(f"{variant}: {runs[variant]['seconds']:.1f} s, {runs[variant]['compiles']} "
          f"programs compiled; load {os.getloadavg()[0]:.2f}", flush=True)
  variants, confirmed = {}, {}
  compiled = len(_compiles)
  for variant, run in runs.items():
    epochs = client_epochs(run["metrics"], conf)
    choices = {}
    for row in run["selection"]:
      algorithm = row["algorithm"]
      if row["grid"] not in confirmed:
        confirmed[row["grid"]] = confirm(args, row, conf.seed)
      choices[algorithm] = {
          "setting": row["grid"], **{k: number(row[k]) for k in KEYS},
          "val_accuracy": number(row["val_accuracy"]),
          "val_accuracy_std_over_seeds": number(row.get("val_accuracy_std_over_seeds")),
          "test_accuracy": number(row["test_accuracy"]),
          "confirmed": confirmed[row["grid"]][algorithm],
          **({"rung": row["rung"], "rung_rounds": row["rung_rounds"]}
             if "rung" in row else {})}
    variants[variant] = {
        "seconds": run["seconds"], "training_seconds": run["training_seconds"],
        "cost_seconds": run["cost_seconds"],
        "other_seconds": run["seconds"] - run["training_seconds"] - run["cost_seconds"],
        "compiles": run["compiles"], "load_before": run["load_before"], "load": run["load"],
        "client_epochs": {a: e["client_epochs"] for a, e in epochs.items()},
        "rounds_computed": {a: e["rounds"] for a, e in epochs.items()},
        "client_epochs_total": sum(e["client_epochs"] for e in epochs.values()),
        "choices": choices}
    if "search" in run:
      variants[variant]["search_rungs"] = sorted(
          {(int(r["rung"]), int(r["settings"]), int(r["rounds"])) for r in run["search"]})
  result["confirm_compiles"] = len(_compiles) - compiled
  grid_run, halving_run = variants["grid"], variants["halving"]
  result["variants"] = variants
  result["ratios"] = {
      "seconds": halving_run["seconds"] / grid_run["seconds"],
      "training_seconds": halving_run["training_seconds"] / grid_run["training_seconds"],
      "client_epochs": halving_run["client_epochs_total"] / grid_run["client_epochs_total"]}
  result["checks"] = {a: check(grid_run["choices"][a]["confirmed"],
                               halving_run["choices"][a]["confirmed"])
                      for a in args.algorithms}
  result["load_end"] = list(os.getloadavg())
  result["peak_rss_bytes"] = peak_rss_bytes()
  return result


def format_table(result: dict) -> str:
  """The variants, the ratios, the choices and the checks as fixed-width text."""
  algorithms = result["algorithms"]
  variants = result["variants"]
  epochs_head = " / ".join(algorithms)
  header = (f"{'variant':>8} {'seconds':>8} {'training s':>10} {'cost s':>7} "
            f"{'other s':>7} {'compiled':>8} {'load':>5} "
            f"{'client-epochs (' + epochs_head + ')':>34} {'total':>9}")
  lines = [header, "-" * len(header)]
  for name, v in variants.items():
    per = " / ".join(f"{v['client_epochs'].get(a, 0):,}" for a in algorithms)
    lines.append(f"{name:>8} {v['seconds']:>8.2f} {v['training_seconds']:>10.2f} "
                 f"{v['cost_seconds']:>7.2f} {v['other_seconds']:>7.2f} {v['compiles']:>8} "
                 f"{v['load'][0]:>5.2f} {per:>34} {v['client_epochs_total']:>9,}")
  ratios = result["ratios"]
  lines.append(f"halving / grid: seconds {ratios['seconds']:.2f}, training seconds "
               f"{ratios['training_seconds']:.2f}, client-epochs {ratios['client_epochs']:.2f}")
  rungs = ", ".join(f"{g} to round {r}" for g, r in result["halving_rungs"])
  lines.append(f"halving's rungs (eta {result['eta']}): {rungs}")
  seeds = result["confirm_seeds"]
  lines.append("")
  header = (f"{'algorithm':>9} {'variant':>8} {'chosen':<44} {'val acc':>7} "
            f"{f'confirmed test acc ({seeds} seeds)':>28}")
  lines += [header, "-" * len(header)]
  for algorithm in algorithms:
    for name, v in variants.items():
      choice = v["choices"][algorithm]
      c = choice["confirmed"]
      lines.append(f"{algorithm:>9} {name:>8} {choice['setting']:<44} "
                   f"{choice['val_accuracy']:>7.4f} "
                   f"{c['test_accuracy']:>19.4f} +- {c['test_accuracy_std_over_seeds']:.4f}")
  lines.append("")
  for algorithm, c in result["checks"].items():
    lines.append(f"check {algorithm}: halving's choice confirms within max(1 point, the seed "
                 f"spread) of the grid's: difference {c['difference']:+.4f}, tolerance "
                 f"{c['tolerance']:.4f}: {c['outcome']}")
  load = lambda values: " ".join(f"{x:.2f}" for x in values)
  lines.append(f"load (1, 5, 15 min): start {load(result['load_start'])}, end "
               f"{load(result['load_end'])}; warm-up {result['warm_up']['seconds']:.1f} s; "
               f"programs compiled by the confirmations {result['confirm_compiles']}")
  return "\n".join(lines)


def parse(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--eta", type=int, default=3,
                      help="halving keeps 1/eta of a rung's settings (default 3)")
  parser.add_argument("--seeds", type=int, default=2, help="seeds of the search (default 2)")
  parser.add_argument("--rounds", type=int, default=40, help="rounds of a run (default 40)")
  parser.add_argument("--eval-every", type=int, default=5,
                      help="evaluate (and end rungs) every this many rounds (default 5)")
  parser.add_argument("--confirm-seeds", type=int, default=3,
                      help="fresh seeds that confirm each choice (default 3)")
  parser.add_argument("--clients", type=int, default=50, help="clients (default 50)")
  parser.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
  parser.add_argument("--lr", type=float, nargs="+", default=list(LRS))
  parser.add_argument("--momentum", type=float, nargs="+", default=list(MOMENTA))
  parser.add_argument("--weight-decay", type=float, nargs="+", default=list(WEIGHT_DECAYS))
  parser.add_argument("--json", metavar="PATH", help="also write everything as JSON")
  args = parser.parse_args(argv)
  check_positive(parser, args, ("seeds", "rounds", "eval_every", "confirm_seeds", "clients"))
  if args.eta < 2:
    parser.error("--eta must be >= 2")
  for name in ("lr", "momentum", "weight_decay"):
    if len(set(getattr(args, name))) != len(getattr(args, name)):
      parser.error(f"--{name.replace('_', '-')} has a value twice")
  return args


def main(argv=None):
  args = parse(argv)
  _listen()
  print("\n".join(machine_info()))
  print(f"started {now()}")
  count = len(args.lr) * len(args.momentum) * len(args.weight_decay)
  print(f"{NAME} --quick, {', '.join(args.algorithms)}: {args.clients} clients, "
        f"{args.rounds} rounds evaluated every {args.eval_every}, {args.seeds} seeds, "
        f"validation_fraction {VALIDATION_FRACTION}; {count} candidates "
        f"({' x '.join(grid(args))}); halving eta {args.eta}: {schedule(args, count)}; "
        f"{args.confirm_seeds} confirm seeds; backend {jax.default_backend()}", flush=True)
  result = measure(args)
  report(result, format_table(result), args.json)
  return result


if __name__ == "__main__":
  main()
