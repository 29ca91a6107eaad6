"""Seconds per neural round vs the number of clients, on 1 and on 8 (emulated) devices.

One round of an algorithm of the registry (default FedAvg) with a cohort of
`participation` x n clients, each training `make_model(MODEL)` (default the MLP
784->512->256->64->10 of benchmarks/nn_round.py) for 1 local epoch of minibatch SGD (batch
10, lr 0.01, momentum 0.5, weight decay 1e-4) on its own `--samples` synthetic examples,
then the server's count-weighted average. The client axis is sharded over `devices`
devices (`Personalized.devices`: shard_map, each device its shard of clients, one psum),
or not sharded at all ('none': the plain vmapped round). The cohort is drawn over
`--groups` client groups (`cohort_groups`, default 8) whatever the device count, so every
row of one n trains the same clients.

Each (n, devices) is measured in its own process started with
XLA_FLAGS=--xla_force_host_platform_device_count=<devices> (1 for 'none'): the data laid
out over the devices (`core.sharding.shard_clients`), `jax.jit(alg.round)` compiled ahead
of time, one warm-up round, then `--rounds` timed rounds, each from the state the previous
one left and with its own key; seconds_per_round is the median, peak_rss_gb the process's
peak resident memory (`ru_maxrss`, compile included).

On a CPU the emulated devices share the same cores, so 8 devices are not faster than 1:
the rows measure the cost of sharding (shard_map, psum, per-device programs), not a
speed-up. On a machine with 8 real devices (GPUs, TPU cores, hosts under
jax.distributed) the same code runs each shard on its own device.

  python benchmarks/nn_scale.py                          # n = 32, 128, 512; none, 1, 8 devices
  python benchmarks/nn_scale.py --quick                  # n = 16, 64: a smoke test
  python benchmarks/nn_scale.py --clients 64 --devices 1 2 4 8 --json scale.json
"""

import argparse
import datetime
import json
import os
import resource
import statistics
import subprocess
import sys
import time

BATCH, LR, MOMENTUM, WEIGHT_DECAY = 10, 0.01, 0.5, 1e-4
INPUT_SHAPES = {"mlp": (28, 28, 1), "cifar10-cnn": (32, 32, 3), "digits-cnn": (8, 8, 1),
                "digits-mlp": (8, 8, 1)}


def measure(args) -> dict:
  """The row of one (n, devices), in this process (its XLA_FLAGS set by `run_child`)."""
  import dataclasses  # here: the parent process never starts JAX

  import jax

  from fedjax_rep.core import sharding
  from fedjax_rep.nn.hparams import hparams as nn_hparams
  from fedjax_rep.nn.models import make_model
  from fedjax_rep.nn.registry import make_algorithm
  from nn_round import synthetic_data  # benchmarks/ is the script's directory

  devices = None if args.devices == "none" else int(args.devices)
  cohort = max(args.groups, round(args.participation * args.clients))
  alg = dataclasses.replace(
      make_algorithm(args.algorithm, model=make_model(args.model, 10), cohort=cohort,
                     local_epochs=1, batch_size=BATCH, client_group=args.client_group),
      cohort_groups=args.groups, devices=devices)
  hparams = nn_hparams(LR, MOMENTUM, WEIGHT_DECAY)
  data = synthetic_data(jax.random.key(0), args.clients, args.samples,
                        INPUT_SHAPES[args.model])
  if devices is not None:
    data = sharding.shard_clients(data, sharding.client_mesh(devices))
  state = jax.block_until_ready(jax.jit(alg.init)(jax.random.key(1), data, hparams))
  key = jax.random.key(2)
  start = time.perf_counter()
  round_fn = jax.jit(alg.round).lower(state, key, data, hparams).compile()
  compile_s = time.perf_counter() - start
  times = []
  for t in range(args.rounds + 1):  # round 0 warms up
    start = time.perf_counter()
    state, metrics = round_fn(state, jax.random.fold_in(key, t), data, hparams)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - start)
  return {"n": args.clients, "devices": devices, "cohort": cohort, "model": args.model,
          "algorithm": args.algorithm, "samples": args.samples, "groups": args.groups,
          "client_group": args.client_group, "seconds_per_round": statistics.median(times[1:]),
          "seconds_all": times[1:], "compile_seconds": compile_s,
          "train_loss": float(metrics["train_loss"]),
          "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
          "load1": os.getloadavg()[0]}


def run_child(args, clients, devices) -> dict:
  """`measure` of (clients, devices) in a fresh process with that many CPU devices."""
  count = 1 if devices == "none" else int(devices)
  env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={count}",
         "JAX_PLATFORMS": "cpu"}
  command = [sys.executable, __file__, "--child", "--clients", str(clients), "--devices",
             devices, "--model", args.model, "--algorithm", args.algorithm, "--samples",
             str(args.samples), "--participation", str(args.participation), "--groups",
             str(args.groups), "--client-group", str(args.client_group), "--rounds",
             str(args.rounds)]
  done = subprocess.run(command, env=env, capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f"n={clients}, devices={devices} failed:\n{done.stderr[-4000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def format_table(rows):
  """The rows as a fixed-width table; 'x none' is the unsharded row's time over this one's
  (below 1: slower than the plain vmapped round)."""
  header = (f"{'n':>6} {'cohort':>6} {'devices':>7} {'s/round':>8} {'x none':>6} "
            f"{'compile s':>9} {'peak RSS GB':>11} {'load':>5}")
  lines = [header, "-" * len(header)]
  for r in rows:
    plain = next((q for q in rows if q["n"] == r["n"] and q["devices"] is None), None)
    ratio = f"{plain['seconds_per_round'] / r['seconds_per_round']:.2f}" if plain else "-"
    lines.append(f"{r['n']:>6} {r['cohort']:>6} {str(r['devices'] or 'none'):>7} "
                 f"{r['seconds_per_round']:>8.3f} {ratio:>6} {r['compile_seconds']:>9.1f} "
                 f"{r['peak_rss_gb']:>11.2f} {r['load1']:>5.2f}")
  return "\n".join(lines)


def uptime() -> str:
  return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--clients", type=int, nargs="+",
                      help="client counts n (default 32 128 512; quick 16 64)")
  parser.add_argument("--devices", nargs="+", default=["none", "1", "8"],
                      help="device counts, or 'none' for the unsharded round (default: "
                      "none 1 8)")
  parser.add_argument("--model", choices=list(INPUT_SHAPES), default="mlp")
  parser.add_argument("--algorithm", default="fedavg",
                      help="a neural algorithm of the registry (default fedavg)")
  parser.add_argument("--samples", type=int, help="samples per client (default 50; quick 20)")
  parser.add_argument("--participation", type=float, default=0.25,
                      help="cohort / n (default 0.25; at least one client per group)")
  parser.add_argument("--groups", type=int, default=8,
                      help="cohort groups, a multiple of every device count (default 8)")
  parser.add_argument("--client-group", type=int, default=4,
                      help="clients per vmap on a device (default 4)")
  parser.add_argument("--rounds", type=int, help="timed rounds (default 5; quick 2)")
  parser.add_argument("--quick", action="store_true", help="smoke test: small n and data")
  parser.add_argument("--json", metavar="PATH", help="also write the rows as a JSON list")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  args.samples = args.samples or (20 if args.quick else 50)
  args.rounds = args.rounds or (2 if args.quick else 5)
  if args.child:
    args.clients, args.devices = args.clients[0], args.devices[0]
    print(json.dumps(measure(args)))
    return
  clients = args.clients or ([16, 64] if args.quick else [32, 128, 512])
  bad = [d for d in args.devices if d != "none" and (not d.isdigit() or int(d) < 1
                                                     or args.groups % int(d))]
  if bad:
    parser.error(f"--devices must be 'none' or divisors of --groups={args.groups}, got {bad}")
  if any(n % args.groups for n in clients):
    parser.error(f"every --clients count must be a multiple of --groups={args.groups}")

  print(f"started {datetime.datetime.now().isoformat(timespec='seconds')}; {uptime()}")
  print(f"{args.algorithm} round, model {args.model}, {args.samples} samples per client, "
        f"participation {args.participation}, {args.groups} cohort groups, vmap groups of "
        f"{args.client_group}, median of {args.rounds} rounds; {os.cpu_count()} CPU cores")
  rows = []
  for n in clients:
    for devices in args.devices:
      rows.append(run_child(args, n, devices))
      r = rows[-1]
      print(f"n={n} devices={devices}: {r['seconds_per_round']:.3f} s/round, compile "
            f"{r['compile_seconds']:.1f} s, peak RSS {r['peak_rss_gb']:.2f} GB, train loss "
            f"{r['train_loss']:.4f}", flush=True)
  print(f"\nfinished {datetime.datetime.now().isoformat(timespec='seconds')}; {uptime()}\n")
  print(format_table(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
