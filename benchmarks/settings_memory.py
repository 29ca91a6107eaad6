"""Peak memory of a grid of settings as one program: the data held once, whatever its size.

  python benchmarks/settings_memory.py --settings 1 8 --json /tmp/settings_memory.json
  python benchmarks/settings_memory.py --n 200 --settings 1 2     # a smoke test

The data of `nn_scale.py`'s synthetic federation: uncapped Synthetic(1, 1) over --n clients
at their natural sizes, 80/20 train/test, in one flat store (`nn_scale.generate`,
`data.flat`; n = 20,000: about 1.97 GiB raw), as the data of one run (a run axis of 1 added
to the store's views: placed on the CPU without a copy); its FedRep on `synthetic-mlp`
(participation 0.01, 10 head epochs then 1 body epoch, batch 10, client groups of
--client-group; `nn_scale.algorithm`). G settings are G lrs geometric in [0.01, 0.1] (G = 1:
nn_scale's 0.05), momentum 0.5, weight decay 1e-4. For each G of --settings, in a process of
its own (peak RSS is a process-lifetime peak): the data built once, then
`Batch(progress=False, width=G).train` of the G settings for --rounds rounds, evaluated after
the last: one `core.loop.run` of nested sweeps, the settings outer with the data's axis None.
Each row: the data's raw bytes, the peak RSS before training (imports, data) and after it,
the seconds of the `train` call (compiling included), the batch runner's estimate of a
setting's states (`batch.settings_that_fit`) and peak(G) / peak(the fewest settings). Holding
G copies of the data would add (G - 1) x the raw bytes; held once, a grid adds its states.
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
from linear_round import check_positive, machine_info, now, peak_rss_bytes, report
import nn_scale
from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.data import flat
from fedjax_rep.experiments import batch
from fedjax_rep.nn.hparams import hparams as nn_hparams
from fedjax_rep.recipes.kit import neural

FEDERATION = nn_scale.FEDERATIONS["synthetic"]
LR_RANGE = (0.01, 0.1)


def lrs(count: int) -> list[float]:
  """`count` step sizes: geometric over LR_RANGE; one is nn_scale's (LR)."""
  return [nn_scale.LR] if count == 1 else [float(lr) for lr in np.geomspace(*LR_RANGE, count)]


def store(n: int, seed: int):
  """The FlatClients of nn_scale's synthetic federation of n clients with a leading run axis
  of 1 ([1, N, ...]; the generated arrays' views, so that the CPU holds them once)."""
  x, y, train_rows, test_rows = nn_scale.generate(FEDERATION, n, seed)
  starts = np.cumsum(train_rows + test_rows) - train_rows - test_rows
  one = flat.segments(x, y, starts, train_rows, starts + train_rows, test_rows,
                      FEDERATION.classes)
  return jax.device_put(jax.tree.map(lambda a: np.asarray(a)[None], one))


# --- one grid size (a child process) ---------------------------------------------------------


def run_child(args) -> dict:
  """The data built once, then `Batch.train` of args.settings[0] settings at that width in
  this (new) process: {seconds, peak_rss_bytes, setup_rss_bytes (the peak before training:
  imports, data), state_bytes_per_setting and width (the settings per call: at most those
  that fit, `batch.settings_that_fit`), backend, width_chosen (`batch.default_width`)}."""
  count = args.settings[0]
  data = store(args.n, args.seed)
  algorithm, _ = nn_scale.algorithm(FEDERATION, args.n, args.client_group, args.precision)
  settings = [nn_hparams(lr, nn_scale.MOMENTUM, nn_scale.WEIGHT_DECAY) for lr in lrs(count)]
  keys = neural.run_keys([args.seed])
  fit, per_setting = batch.settings_that_fit(algorithm, data, settings[0], keys)
  setup_rss = peak_rss_bytes()
  start = time.perf_counter()
  results = batch.Batch(progress=False, width=count).train(
      "settings-memory", algorithm, data, settings, keys, args.rounds)
  seconds = time.perf_counter() - start
  assert len(results) == count and all(
      np.all(np.isfinite(r["metrics"]["train_loss"])) for r in results), "a run diverged"
  return {"seconds": seconds, "peak_rss_bytes": peak_rss_bytes(),
          "setup_rss_bytes": setup_rss, "state_bytes_per_setting": per_setting,
          "width": min(count, fit), "backend": jax.default_backend(),
          "width_chosen": batch.default_width()}


def child(count: int, args) -> dict:
  """`run_child` of `count` settings in a new process; {'error': text} if it fails."""
  command = [sys.executable, os.path.abspath(__file__), "--child", "--settings", str(count),
             "--n", str(args.n), "--seed", str(args.seed), "--rounds", str(args.rounds),
             "--client-group", str(args.client_group), "--precision", args.precision]
  run = subprocess.run(command, capture_output=True, text=True)
  if run.returncode != 0:
    return {"error": f"exit {run.returncode}: {run.stderr.strip()[-2000:]}"}
  return json.loads(run.stdout.strip().splitlines()[-1])


# --- the parent ------------------------------------------------------------------------------


def measure(count: int, args) -> dict:
  """The row of `count` settings: the data's sizes (`nn_scale.memory_estimates`), the
  child's result and the load averages (1, 5, 15 min) after it."""
  row = {"settings": count, "n": args.n, "cohort": cohort_size(args.n, nn_scale.PARTICIPATION),
         "rounds": args.rounds, "client_group": args.client_group, "precision": args.precision,
         "lrs": lrs(count),
         **nn_scale.memory_estimates(FEDERATION, args.n, args.seed)}
  result = child(count, args)
  print(f"[G={count}] {result}", flush=True)
  row.update({key: result.get(key) for key in (
      "seconds", "peak_rss_bytes", "setup_rss_bytes", "state_bytes_per_setting", "width",
      "backend", "width_chosen")})
  if "error" in result:
    row["error"] = result["error"]
  row["load"] = list(os.getloadavg())
  return row


def with_ratios(rows: list[dict]) -> list[dict]:
  """The rows with peak_ratio: peak RSS over the peak of the row of the fewest settings
  (None where either is missing)."""
  first = min(rows, key=lambda r: r["settings"])["peak_rss_bytes"]
  return [{**r, "peak_ratio": None if first is None or r["peak_rss_bytes"] is None
           else r["peak_rss_bytes"] / first} for r in rows]


def text(value, form, scale=1.0) -> str:
  """value / scale formatted by `form` ('-' for None)."""
  return "-" if value is None else format(value / scale, form)


def format_table(rows) -> str:
  """The rows as a fixed-width text table (GiB; W: settings per call; W chosen: the width
  the batch runner chooses on the backend, 'all that fit' for None)."""
  header = (f"{'G':>3} {'W':>3} {'n':>6} {'rounds':>6} {'raw GiB':>7} {'setup GiB':>9} "
            f"{'peak GiB':>8} {'peak/peak(1)':>12} {'states/G GiB':>12} {'seconds':>8} "
            f"{'load':>5} {'backend':>7} {'W chosen':>12}")
  lines = [header, "-" * len(header)]
  for r in rows:
    chosen = "all that fit" if r["width_chosen"] is None else str(r["width_chosen"])
    lines.append(
        f"{r['settings']:>3} {str(r['width'] or '-'):>3} {r['n']:>6} {r['rounds']:>6} "
        f"{r['raw_data_bytes'] / 2**30:>7.2f} {text(r['setup_rss_bytes'], '.2f', 2**30):>9} "
        f"{text(r['peak_rss_bytes'], '.2f', 2**30):>8} {text(r['peak_ratio'], '.2f'):>12} "
        f"{text(r['state_bytes_per_setting'], '.3f', 2**30):>12} "
        f"{text(r['seconds'], '.1f'):>8} {r['load'][0]:>5.2f} {str(r['backend']):>7} "
        f"{chosen:>12}")
  lines += [f"G={r['settings']}: error: {r['error']}" for r in rows if r.get("error")]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--settings", type=int, nargs="+", default=[1, 8],
                      help="grid sizes G: lr settings, each run at width G (default 1 8)")
  parser.add_argument("--n", type=int, default=20_000,
                      help="clients of the Synthetic store (default 20000: 1.97 GiB raw)")
  parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--client-group", type=int, default=10,
                      help="clients trained together in one vmap (default 10)")
  parser.add_argument("--precision", choices=("float32", "bf16"), default="float32")
  parser.add_argument("--json", metavar="PATH", help="also write the rows as a JSON list")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  check_positive(parser, args, ("n", "rounds", "client_group"), lists=("settings",))
  if args.child:
    print(json.dumps(run_child(args)))
    return
  print("\n".join(machine_info()))
  print(f"started {now()}")
  print(f"FedRep on Synthetic(1, 1), n = {args.n} at natural sizes, participation "
        f"{nn_scale.PARTICIPATION}, {args.rounds} rounds, client groups of "
        f"{args.client_group}, {args.precision}; each grid size in a process of its own",
        flush=True)
  rows = with_ratios([measure(count, args) for count in args.settings])
  report(rows, format_table(rows), args.json)


if __name__ == "__main__":
  main()
