"""A neural hyperparameter grid as one program vs its settings one after another.

  python benchmarks/nn_sweep.py --settings 1 4 8 --json /tmp/nn_sweep.json
  python benchmarks/nn_sweep.py --model cifar10-cnn --settings 1 4 --repeats 3
  python benchmarks/nn_sweep.py --settings 2 --seeds 1 --rounds 2 --clients 20   # a smoke test

The setup of a recipe, by --model (its flags' defaults are the recipe's):
  digits-mlp   `digits-personalized`: digits over --clients (50) clients with 2 class shards
               each (`digits.federated(n, "classes", 2, 0.5, seed=s)`), the MLP `digits-mlp`,
               40 rounds, evaluated every 5, client groups of 10; its (lr, momentum) (0.05, 0.5);
  cifar10-cnn  `fedrep-table1-cifar10 --quick`: 600 random CIFAR-10-shaped examples per split
               (`tfds_data.load(..., mock_examples=600)`) over --clients (10) clients with 2
               class shards each (`partition.partition("classes", ...)`), the CNN
               `cifar10-cnn`, 3 rounds, evaluated every round, client groups of 1; (0.01, 0.5).
Seeds 0..S-1 stacked; FedRep at participation 0.1 (10 head epochs then 1 body epoch, batch 10).
G settings are G (lr, momentum) pairs: lr geometric in [0.01, 0.1] (cifar10-cnn: [0.001,
0.01], at most the recipe's: larger steps on the mock data diverge or turn chaotic, their
round-off grown past the comparison's tolerance) and momentum 0.5, 0.9, 0.5, ... (G = 1: the
recipe's), weight decay 1e-4. Two ways to run the G x S runs, both by the batch runner
(`experiments.batch.Batch.train`), as a recipe runs a grid:
  one program        width G: one `core.loop.run` of nested sweeps, the settings outer (the
                     data's and the run keys' axis None: the data held once), the S seeds
                     inner;
  one at a time      width 1: for each setting, `core.loop.run` over the S seeds with
                     sweep_axes (0, None, 0): one program compiles once and serves every
                     setting (the hparams are traced).
Each row also names the width the runner chooses on this backend (`batch.default_width`).
Both are the same arithmetic: their final metrics (the last round's and the last
evaluation's) are compared on the first repetition (max |difference|, asserted within
float32 round-off). Timing, in this process: both compiled and run once, then --repeats
repetitions, the two interleaved (their order alternating); a variant's seconds are its
fastest repetition (other processes only add time), from `Batch.train`'s call to its return
(initialisation, every round and evaluation, metrics to the host). Each variant also runs
once in a process of its own: its compiling (tracing, lowering, XLA: JAX's monitoring events
during that first run) and its peak RSS. Programs compile with `core.loop.QUICK_COMPILE`
on the CPU, as the recipes' (`loop.jit_by_algorithm`).
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np

# benchmarks/ is the script's directory
from linear_round import check_positive, machine_info, now, peak_rss_bytes, report
from recipe_time import compilation, compilation_totals

PARTICIPATION = 0.1
HEAD_EPOCHS, LOCAL_EPOCHS, BATCH = 10, 1, 10
WEIGHT_DECAY = 1e-4
MOMENTA = (0.5, 0.9)
CLASSES_PER_CLIENT = 2
NUM_CLASSES = 10  # digits' and CIFAR-10's
CIFAR_MOCK_EXAMPLES = 600  # fedrep-table1-cifar10 --quick's mock_examples
VARIANTS = ("one-program", "one-at-a-time")
WIDTHS = {"one-program": None, "one-at-a-time": 1}  # the runner's width (None: G)
RTOL, ATOL = 1e-4, 1e-5  # float32 round-off: the two programs batch the runs differently


@dataclasses.dataclass(frozen=True)
class Setup:
  """A model's recipe: its name, its (lr, momentum), the range of a grid's lrs and its
  clients, rounds, evaluation period and client group (the defaults of --clients, --rounds,
  --eval-every and --client-group)."""
  recipe: str
  setting: tuple
  lr_range: tuple
  clients: int
  rounds: int
  eval_every: int
  client_group: int


SETUPS = {
    "digits-mlp": Setup("digits-personalized", (0.05, 0.5), (0.01, 0.1), 50, 40, 5, 10),
    "cifar10-cnn": Setup("fedrep-table1-cifar10 --quick", (0.01, 0.5), (0.001, 0.01), 10, 3,
                         1, 1),
}


def settings(count: int, model: str = "digits-mlp") -> list[tuple[float, float]]:
  """`count` (lr, momentum) pairs: lr geometric over the `model`'s lr_range, momentum cycling
  through MOMENTA; one setting is its recipe's (digits-personalized's (0.05, 0.5))."""
  if count == 1:
    return [SETUPS[model].setting]
  lrs = np.geomspace(*SETUPS[model].lr_range, count)
  return [(float(lr), MOMENTA[g % len(MOMENTA)]) for g, lr in enumerate(lrs)]


def width_text(width: int | None) -> str:
  """A width the batch runner chooses (`batch.default_width`) as text: the number, or 'all
  that fit' for None."""
  return "all that fit" if width is None else str(width)


def datasets(args, seed_values) -> list:
  """The ClientDatasets of args.model's recipe over args.clients clients, one per seed of
  `seed_values` (CIFAR-10's mock examples drawn once, partitioned by each seed)."""
  from fedjax_rep.data import digits, federated, tfds_data
  from fedjax_rep.data import partition as partition_lib
  if args.model == "digits-mlp":
    return [digits.federated(args.clients, "classes", CLASSES_PER_CLIENT, 0.5, seed=s)
            for s in seed_values]
  x, y, x_test, y_test = tfds_data.load("cifar10", mock_examples=CIFAR_MOCK_EXAMPLES)
  out = []
  for s in seed_values:
    parts, test_parts = partition_lib.partition(
        "classes", y, y_test, num_clients=args.clients, seed=s,
        classes_per_client=CLASSES_PER_CLIENT)
    out.append(federated.client_datasets(x, y, parts, x_test, y_test, test_parts,
                                         NUM_CLASSES))
  return out


def problem(args):
  """(algorithm, data [S, ...], run keys [S]) of args.model's recipe's FedRep over
  args.clients clients and args.seeds seeds."""
  import fedjax_rep as fr
  from fedjax_rep.data import federated
  from fedjax_rep.recipes.kit import neural
  seed_values = list(range(args.seeds))
  data = federated.stack(datasets(args, seed_values))
  model = fr.make_model(args.model, NUM_CLASSES, precision=args.precision)
  algorithm = fr.make_neural_algorithm(
      "fedrep", model=model, cohort=fr.cohort_size(args.clients, PARTICIPATION),
      local_epochs=LOCAL_EPOCHS, head_epochs=HEAD_EPOCHS, batch_size=BATCH,
      client_group=args.client_group)
  return algorithm, data, neural.run_keys(seed_values)


def variants(args, count):
  """{variant: a function running it once and returning its runs' final metrics} for
  `count` settings (`settings`), in run order (setting-major, then seed): `Batch.train` of
  width `count` ('one-program') or 1 ('one-at-a-time')."""
  import fedjax_rep as fr
  from fedjax_rep.experiments import batch
  algorithm, data, keys = problem(args)
  hparams = [fr.nn_hparams(lr, momentum, WEIGHT_DECAY)
             for lr, momentum in settings(count, args.model)]

  def variant(width):
    runner = batch.Batch(progress=False, width=width)
    return lambda: final_metrics(runner.train("nn-sweep", algorithm, data, hparams, keys,
                                              args.rounds, eval_every=args.eval_every))

  return {name: variant(width or count) for name, width in WIDTHS.items()}


def final_metrics(results) -> dict[str, np.ndarray]:
  """{name: [G * S]}: the last round's metrics and the last evaluation's (`eval:` names) of
  `Batch.train`'s results (one per setting), setting-major."""
  finals = [{**{name: v[:, -1] for name, v in result["metrics"].items()},
             **{"eval:" + name: v[:, -1] for name, v in result["eval"].items()}}
            for result in results]
  return {name: np.concatenate([f[name] for f in finals]) for name in finals[0]}


def max_abs_diff(a: dict, b: dict) -> float:
  """The largest |difference| between two `final_metrics` (NaN where only one is NaN),
  after asserting that they agree within float32 round-off (RTOL, ATOL)."""
  assert a.keys() == b.keys(), (sorted(a), sorted(b))
  worst = 0.0
  for name in a:
    x, y = np.asarray(a[name], np.float64), np.asarray(b[name], np.float64)
    np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, equal_nan=True,
                               err_msg=f"final {name}: one program vs one at a time")
    both = np.isnan(x) & np.isnan(y)
    worst = max(worst, float(np.max(np.where(both, 0.0, np.abs(x - y)), initial=0.0)))
  return worst


# --- a variant in a process of its own -------------------------------------------------------


def run_child(args) -> dict:
  """One run of variant args.child with args.settings[0] settings in this (new) process:
  {compile_seconds (`recipe_time.compilation`'s tracing + lowering + XLA of that run),
  first_seconds, peak_rss_bytes, setup_rss_bytes (the peak before the run: imports, data)}."""
  run = variants(args, args.settings[0])[args.child]
  setup_rss = peak_rss_bytes()
  events = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, seconds, **kw: events.append((event, kw.get("fun_name", ""), seconds)))
  start = time.perf_counter()
  run()
  seconds = time.perf_counter() - start
  return {"compile_seconds": compilation_totals(compilation(events))["compiling"],
          "first_seconds": seconds, "peak_rss_bytes": peak_rss_bytes(),
          "setup_rss_bytes": setup_rss}


def child(variant, count, args) -> dict:
  """`run_child` of `variant` with `count` settings in a new process; {'error': text} if
  it fails."""
  command = [sys.executable, os.path.abspath(__file__), "--child", variant, "--model",
             args.model, "--settings", str(count), "--seeds", str(args.seeds), "--rounds",
             str(args.rounds), "--clients", str(args.clients), "--client-group",
             str(args.client_group), "--eval-every", str(args.eval_every), "--precision",
             args.precision]
  run = subprocess.run(command, capture_output=True, text=True)
  if run.returncode != 0:
    return {"error": f"exit {run.returncode}: {run.stderr.strip()[-2000:]}"}
  return json.loads(run.stdout.strip().splitlines()[-1])


# --- the parent ------------------------------------------------------------------------------


def measure(count, args) -> dict:
  """The row of `count` settings: both variants timed here (interleaved, after a first
  run each), compared on the first repetition, then each in a process of its own; the load
  averages (1, 5, 15 min) before and after."""
  from fedjax_rep.experiments import batch
  load_before = list(os.getloadavg())
  runs = variants(args, count)
  for run in runs.values():  # compile, and warm
    run()
  times = {variant: [] for variant in VARIANTS}
  difference = None
  for repetition in range(args.repeats):
    order = VARIANTS if repetition % 2 == 0 else VARIANTS[::-1]
    finals = {}
    for variant in order:
      start = time.perf_counter()
      finals[variant] = runs[variant]()
      times[variant].append(time.perf_counter() - start)
    if difference is None:
      difference = max_abs_diff(*(finals[variant] for variant in VARIANTS))
  one, alone = min(times["one-program"]), min(times["one-at-a-time"])
  print(f"[G={count}] one program {one:.3f} s, one at a time {alone:.3f} s (fastest of "
        f"{args.repeats}); max |difference| {difference:.1e}; load {os.getloadavg()[0]:.2f}",
        flush=True)
  children = {variant: child(variant, count, args) for variant in VARIANTS}
  print(f"[G={count}] own processes: {children}", flush=True)
  row = {"model": args.model, "recipe": SETUPS[args.model].recipe, "settings": count,
         "seeds": args.seeds, "rounds": args.rounds, "clients": args.clients,
         "client_group": args.client_group, "eval_every": args.eval_every,
         "precision": args.precision, "lrs_momenta": settings(count, args.model),
         "seconds_one_program": one, "seconds_one_at_a_time": alone, "ratio": one / alone,
         "seconds_one_program_all": times["one-program"],
         "seconds_one_at_a_time_all": times["one-at-a-time"]}
  for variant, suffix in (("one-program", "_one_program"), ("one-at-a-time", "_one_at_a_time")):
    result = children[variant]
    row[f"compile_seconds{suffix}"] = result.get("compile_seconds")
    row[f"first_seconds{suffix}"] = result.get("first_seconds")
    row["peak_rss_bytes" + ("" if variant == "one-program" else suffix)] = result.get(
        "peak_rss_bytes")
    row[f"setup_rss_bytes{suffix}"] = result.get("setup_rss_bytes")
    if "error" in result:
      row[f"error{suffix}"] = result["error"]
  row.update({"max_abs_diff": difference, "load_before": load_before,
              "load": list(os.getloadavg()), "backend": jax.default_backend(),
              "width_chosen": batch.default_width()})
  return row


def text(value, form, scale=1.0) -> str:
  """value / scale formatted by `form` ('-' for None)."""
  return "-" if value is None else format(value / scale, form)


def format_table(rows) -> str:
  """The rows as a fixed-width text table (RSS in GiB; W chosen: the width the batch runner
  chooses on the backend, 'all that fit' for None)."""
  header = (f"{'G':>3} {'S':>3} {'rounds':>6} {'one prog s':>10} {'one-by-one s':>12} "
            f"{'ratio':>6} {'compile s (prog / 1-by-1)':>25} {'peak RSS GiB (prog / 1-by-1)':>28} "
            f"{'max diff':>8} {'load':>5} {'backend':>7} {'W chosen':>12}")
  lines = [header, "-" * len(header)]
  for r in rows:
    compiles = (f"{text(r['compile_seconds_one_program'], '.2f')} / "
                f"{text(r['compile_seconds_one_at_a_time'], '.2f')}")
    rss = (f"{text(r['peak_rss_bytes'], '.2f', 2**30)} / "
           f"{text(r['peak_rss_bytes_one_at_a_time'], '.2f', 2**30)}")
    lines.append(
        f"{r['settings']:>3} {r['seeds']:>3} {r['rounds']:>6} {r['seconds_one_program']:>10.3f} "
        f"{r['seconds_one_at_a_time']:>12.3f} {r['ratio']:>6.2f} {compiles:>25} {rss:>28} "
        f"{r['max_abs_diff']:>8.1e} {r['load'][0]:>5.2f} {r['backend']:>7} "
        f"{width_text(r['width_chosen']):>12}")
  for r in rows:
    for key in ("error_one_program", "error_one_at_a_time"):
      if r.get(key):
        lines.append(f"G={r['settings']}: {key}: {r[key]}")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", choices=tuple(SETUPS), default="digits-mlp",
                      help="the recipe's setup to run (default digits-mlp)")
  parser.add_argument("--settings", type=int, nargs="+", default=[1, 4, 8],
                      help="grid sizes G: (lr, momentum) settings (default 1 4 8)")
  parser.add_argument("--seeds", type=int, default=2, help="seeds S per setting (default 2)")
  parser.add_argument("--rounds", type=int,
                      help="rounds of each run (default: the recipe's, 40 or 3)")
  parser.add_argument("--clients", type=int, help="clients n (default: 50 or 10)")
  parser.add_argument("--client-group", type=int,
                      help="clients trained together in one vmap (default: 10 or 1)")
  parser.add_argument("--eval-every", type=int,
                      help="evaluate every this many rounds (default: 5 or 1)")
  parser.add_argument("--precision", choices=("float32", "bf16"), default="float32")
  parser.add_argument("--repeats", type=int, default=7,
                      help="timed repetitions of each variant, interleaved (default 7)")
  parser.add_argument("--json", metavar="PATH", help="also write the rows as a JSON list")
  parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
  args = parser.parse_args()
  for name in ("rounds", "clients", "client_group", "eval_every"):
    if getattr(args, name) is None:
      setattr(args, name, getattr(SETUPS[args.model], name))
  check_positive(parser, args, ("seeds", "rounds", "clients", "client_group", "eval_every",
                                 "repeats"), lists=("settings",))
  if args.child:
    print(json.dumps(run_child(args)))
    return
  from fedjax_rep.experiments import batch
  print("\n".join(machine_info()))
  print(f"started {now()}")
  print(f"{SETUPS[args.model].recipe}'s FedRep ({args.model}): {args.clients} clients, "
        f"participation {PARTICIPATION}, {args.seeds} seeds, {args.rounds} rounds, client "
        f"groups of {args.client_group}, {args.precision}; {args.repeats} interleaved "
        f"repetitions; backend {jax.default_backend()}, the batch runner's width there: "
        f"{width_text(batch.default_width())}", flush=True)
  rows = [measure(count, args) for count in args.settings]
  report(rows, format_table(rows), args.json)


if __name__ == "__main__":
  main()
