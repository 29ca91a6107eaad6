"""A neural hyperparameter grid as one program vs its settings one after another.

  python benchmarks/nn_sweep.py --settings 1 4 8 --json /tmp/nn_sweep.json
  python benchmarks/nn_sweep.py --settings 2 --seeds 1 --rounds 2 --clients 20   # a smoke test

The setup of `digits-personalized`: digits over --clients clients with 2 class shards each
(`digits.federated(n, "classes", 2, 0.5, seed=s)`, seeds 0..S-1 stacked), the MLP
`digits-mlp`, FedRep at participation 0.1 (10 head epochs then 1 body epoch, batch 10,
client groups of --client-group), evaluated every --eval-every rounds. G settings are G
(lr, momentum) pairs: lr geometric in [0.01, 0.1] and momentum 0.5, 0.9, 0.5, ... (G = 1:
the recipe's lr 0.05, momentum 0.5), weight decay 1e-4. Two ways to run the G x S runs:
  one program        one `core.loop.run` with sweep_axes (0, 0, 0): the hparams stacked
                     over the G x S runs (setting-major), the data and the run keys tiled G
                     times (`experiments.shared.concatenate`, `experiments.neural.run_keys`);
  one at a time      for each setting, `core.loop.run` over the S seeds with sweep_axes
                     (0, None, 0), as a recipe runs one setting: its program compiles once
                     and serves every setting (the hparams are traced).
Both are the same arithmetic: their final metrics (the last round's and the last
evaluation's) are compared on the first repetition (max |difference|, asserted within
float32 round-off). Timing, in this process: both compiled and run once, then --repeats
repetitions, the two interleaved (their order alternating); a variant's seconds are its
fastest repetition (other processes only add time), from `loop.run`'s call to its return
(initialisation, every round and evaluation, metrics to the host). Each variant also runs
once in a process of its own: its compiling (tracing, lowering, XLA: JAX's monitoring events
during that first run) and its peak RSS. Programs compile with `core.loop.QUICK_COMPILE`
on the CPU, as the recipes' (`loop.jit_by_algorithm`).
"""

import argparse
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np

# benchmarks/ is the script's directory
from linear_round import machine_info, now, peak_rss_bytes, write_json
from recipe_time import compilation, compilation_totals

PARTICIPATION = 0.1
HEAD_EPOCHS, LOCAL_EPOCHS, BATCH = 10, 1, 10
WEIGHT_DECAY = 1e-4
LR_RANGE = (0.01, 0.1)
MOMENTA = (0.5, 0.9)
VARIANTS = ("one-program", "one-at-a-time")
RTOL, ATOL = 1e-4, 1e-5  # float32 round-off: the two programs batch the runs differently


def settings(count: int) -> list[tuple[float, float]]:
  """`count` (lr, momentum) pairs: lr geometric over LR_RANGE, momentum cycling through
  MOMENTA; one setting is digits-personalized's (0.05, 0.5)."""
  if count == 1:
    return [(0.05, 0.5)]
  lrs = np.geomspace(*LR_RANGE, count)
  return [(float(lr), MOMENTA[g % len(MOMENTA)]) for g, lr in enumerate(lrs)]


def problem(args):
  """(algorithm, data [S, ...], run keys [S]) of digits-personalized's FedRep over
  args.clients clients and args.seeds seeds."""
  import fedjax_rep as fr
  from fedjax_rep.data import digits, federated
  from fedjax_rep.experiments import neural
  seed_values = list(range(args.seeds))
  data = federated.stack([digits.federated(args.clients, "classes", 2, 0.5, seed=s)
                          for s in seed_values])
  model = fr.make_model("digits-mlp", digits.NUM_CLASSES, precision=args.precision)
  algorithm = fr.make_neural_algorithm(
      "fedrep", model=model, cohort=fr.cohort_size(args.clients, PARTICIPATION),
      local_epochs=LOCAL_EPOCHS, head_epochs=HEAD_EPOCHS, batch_size=BATCH,
      client_group=args.client_group)
  return algorithm, data, neural.run_keys(seed_values)


def variants(args, count):
  """{variant: a function running it once and returning its runs' final metrics} for
  `count` settings (`settings`): 'one-program' returns them in run order (setting-major,
  then seed), 'one-at-a-time' concatenates each setting's in the same order."""
  import fedjax_rep as fr
  from fedjax_rep.core import loop
  from fedjax_rep.experiments import neural, shared
  algorithm, data, keys = problem(args)
  hparams = [fr.nn_hparams(lr, momentum, WEIGHT_DECAY) for lr, momentum in settings(count)]
  stacked = jax.tree.map(lambda *leaves: np.repeat(np.stack([np.asarray(v) for v in leaves]),
                                                   args.seeds, axis=0), *hparams)
  tiled = shared.concatenate([data] * count)
  tiled_keys = neural.run_keys(list(range(args.seeds)), count)
  run = dict(eval_every=args.eval_every, progress=False)

  def one_program():
    return final_metrics(loop.run(algorithm, tiled, stacked, tiled_keys, args.rounds,
                                  sweep_axes=(0, 0, 0), **run))

  def one_at_a_time():
    finals = [final_metrics(loop.run(algorithm, data, h, keys, args.rounds,
                                     sweep_axes=(0, None, 0), **run)) for h in hparams]
    return {name: np.concatenate([f[name] for f in finals]) for name in finals[0]}

  return {"one-program": one_program, "one-at-a-time": one_at_a_time}


def final_metrics(result) -> dict[str, np.ndarray]:
  """{name: [runs]}: the last round's metrics and the last evaluation's (`eval:` names)."""
  out = {name: np.asarray(v)[:, -1] for name, v in result.metrics.items()}
  out.update({"eval:" + name: np.asarray(v)[:, -1] for name, v in result.eval_metrics.items()})
  return out


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
  command = [sys.executable, os.path.abspath(__file__), "--child", variant,
             "--settings", str(count), "--seeds", str(args.seeds), "--rounds", str(args.rounds),
             "--clients", str(args.clients), "--client-group", str(args.client_group),
             "--eval-every", str(args.eval_every), "--precision", args.precision]
  run = subprocess.run(command, capture_output=True, text=True)
  if run.returncode != 0:
    return {"error": f"exit {run.returncode}: {run.stderr.strip()[-2000:]}"}
  return json.loads(run.stdout.strip().splitlines()[-1])


# --- the parent ------------------------------------------------------------------------------


def measure(count, args) -> dict:
  """The row of `count` settings: both variants timed here (interleaved, after a first
  run each), compared on the first repetition, then each in a process of its own; the load
  averages (1, 5, 15 min) before and after."""
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
  row = {"settings": count, "seeds": args.seeds, "rounds": args.rounds,
         "clients": args.clients, "client_group": args.client_group,
         "precision": args.precision, "lrs_momenta": settings(count),
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
              "load": list(os.getloadavg()),
              "backend": jax.default_backend()})
  return row


def text(value, form, scale=1.0) -> str:
  """value / scale formatted by `form` ('-' for None)."""
  return "-" if value is None else format(value / scale, form)


def format_table(rows) -> str:
  """The rows as a fixed-width text table (RSS in GiB)."""
  header = (f"{'G':>3} {'S':>3} {'rounds':>6} {'one prog s':>10} {'one-by-one s':>12} "
            f"{'ratio':>6} {'compile s (prog / 1-by-1)':>25} {'peak RSS GiB (prog / 1-by-1)':>28} "
            f"{'max diff':>8} {'load':>5}")
  lines = [header, "-" * len(header)]
  for r in rows:
    compiles = (f"{text(r['compile_seconds_one_program'], '.2f')} / "
                f"{text(r['compile_seconds_one_at_a_time'], '.2f')}")
    rss = (f"{text(r['peak_rss_bytes'], '.2f', 2**30)} / "
           f"{text(r['peak_rss_bytes_one_at_a_time'], '.2f', 2**30)}")
    lines.append(
        f"{r['settings']:>3} {r['seeds']:>3} {r['rounds']:>6} {r['seconds_one_program']:>10.3f} "
        f"{r['seconds_one_at_a_time']:>12.3f} {r['ratio']:>6.2f} {compiles:>25} {rss:>28} "
        f"{r['max_abs_diff']:>8.1e} {r['load'][0]:>5.2f}")
  for r in rows:
    for key in ("error_one_program", "error_one_at_a_time"):
      if r.get(key):
        lines.append(f"G={r['settings']}: {key}: {r[key]}")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--settings", type=int, nargs="+", default=[1, 4, 8],
                      help="grid sizes G: (lr, momentum) settings (default 1 4 8)")
  parser.add_argument("--seeds", type=int, default=2, help="seeds S per setting (default 2)")
  parser.add_argument("--rounds", type=int, default=40,
                      help="rounds of each run (default 40, the recipe's --quick)")
  parser.add_argument("--clients", type=int, default=50, help="clients n (default 50)")
  parser.add_argument("--client-group", type=int, default=10,
                      help="clients trained together in one vmap (default 10)")
  parser.add_argument("--eval-every", type=int, default=5,
                      help="evaluate every this many rounds (default 5)")
  parser.add_argument("--precision", choices=("float32", "bf16"), default="float32")
  parser.add_argument("--repeats", type=int, default=7,
                      help="timed repetitions of each variant, interleaved (default 7)")
  parser.add_argument("--json", metavar="PATH", help="also write the rows as a JSON list")
  parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
  args = parser.parse_args()
  for name in ("seeds", "rounds", "clients", "client_group", "eval_every", "repeats"):
    if getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')} must be >= 1")
  if min(args.settings) < 1:
    parser.error("--settings must be >= 1")
  if args.child:
    print(json.dumps(run_child(args)))
    return
  print("\n".join(machine_info()))
  print(f"started {now()}")
  print(f"digits-personalized's FedRep: {args.clients} clients, participation {PARTICIPATION}, "
        f"{args.seeds} seeds, {args.rounds} rounds, client groups of {args.client_group}, "
        f"{args.precision}; {args.repeats} interleaved repetitions", flush=True)
  rows = [measure(count, args) for count in args.settings]
  print(f"\nfinished {now()}\n")
  print(format_table(rows))
  if args.json:
    write_json(args.json, rows)


if __name__ == "__main__":
  main()
