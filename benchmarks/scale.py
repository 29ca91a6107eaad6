"""Seconds per round and peak memory of FedRep rounds from 10^5 to 10^7 clients, and of the
neural round (`--round neural`), on 1 or 8 (emulated) devices.

Each configuration (clients n, data mode, devices) runs in its own subprocess, so its peak
resident memory (ru_maxrss of that process) is its own; the number of devices is set
there through XLA_FLAGS=--xla_force_host_platform_device_count=D (emulated CPU devices
share this machine's cores: more devices is a check of the sharded program, not a
speed-up here). With `--platform cuda` (any JAX_PLATFORMS value but cpu) the subprocess
runs on that accelerator's real devices instead, and the table adds their peak memory
(the allocator's peak_bytes_in_use, summed over the devices used). Next to the measured
peak the table prints `fedjax_rep.linear.memory`'s estimate. A configuration that cannot
fit stops in its subprocess with the memory check's one-line error, shown in the table.

  python benchmarks/scale.py --clients 1e5,1e6,1e7 --mode fresh --rounds 2 --json rows.json
  python benchmarks/scale.py --clients 1e5,1e6 --mode fresh-statistics --devices 1,8

Rows (--json): n, mode, devices, round, platform, seconds_per_round, init_seconds,
warm_up_seconds (compilation + two rounds), peak_rss_gb, device_peak_gb (None on the CPU),
estimate_gb, load_average, error.
Modes: fixed (X [n, m, d] in memory), fresh (direct samples), fresh-statistics
(FreshData(sampler="statistics")). `--round` picks an entry of ROUNDS, a function(config) ->
dict of timings run in the subprocess:

- linear: FedRep, d=50, k=5, m=10, full participation, `devices` > 1 sharded
  (FedRep(devices=...)).
- neural: FedAvg (`fedjax_rep.nn.registry`) with a cohort of a quarter of the n clients,
  each training the MLP 784->512->256->64->10 of benchmarks/nn_round.py for one local
  epoch of minibatch SGD (batch 10, lr 0.01, momentum 0.5, weight decay 1e-4) on its own
  50 synthetic examples (fixed data), in vmap groups of 4 clients; the cohort is drawn over
  8 client groups on any number of devices, so every row of one n trains the same clients.
  `devices` > 1 shards the client axis with shard_map (`Personalized.devices`, one psum).

  python benchmarks/scale.py --round neural --clients 32,128,512 --devices 1,8 --rounds 5
"""

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

DIM, REP_DIM, SAMPLES = 50, 5, 10
MODES = ("fixed", "fresh", "fresh-statistics")
RESULT = "RESULT "  # prefix of the subprocess's result line


def linear_round(config: dict) -> dict:
  """Runs `config` (n, mode, devices, rounds, block) in this process: memory check, problem,
  initial state, two warm-up rounds (compile), then `rounds` timed rounds (same programs)."""
  import jax
  import jax.numpy as jnp

  import fedjax_rep as fr
  from fedjax_rep.linear import memory

  n, mode, devices = config["n"], config["mode"], config["devices"]
  estimate = memory.check(n, DIM, REP_DIM, SAMPLES, mode, block=config["block"],
                          devices=devices)
  start = time.perf_counter()
  problem = fr.make_problem(jax.random.key(0), n, DIM, REP_DIM, math.sqrt(1e-3))
  if mode == "fixed":
    data = fr.make_fixed_data(jax.random.key(1), problem, SAMPLES)
  else:
    data = fr.FreshData(problem, SAMPLES,
                        sampler="statistics" if mode == "fresh-statistics" else "direct")
  algorithm = fr.FedRep(rep_dim=REP_DIM, cohort=n, block=config["block"],
                        devices=None if devices == 1 else devices)
  hparams = fr.LinearHparams(lr=jnp.float32(0.1), head_lr=jnp.float32(0.1))
  key = jax.random.key(2)
  state = jax.block_until_ready(fr.init_state(algorithm, data, hparams, key))
  init_seconds = time.perf_counter() - start
  # Two warm-up rounds (they compile); the timed rounds continue the same run.
  warm = fr.run(algorithm, data, hparams, key, 2, state=state, chunk=1, progress=False)
  rounds = config["rounds"]
  timed = fr.run(algorithm, data, hparams, key, 2 + rounds, state=warm.state, start_round=2,
                 diverged=warm.diverged, reference=warm.reference, chunk=1, progress=False)
  return {"seconds_per_round": timed.seconds / rounds, "init_seconds": init_seconds,
          "warm_up_seconds": warm.seconds, "estimate_gb": estimate["total"] / 1e9,
          "estimate": memory.describe(estimate),
          "final_train_loss": float(timed.metrics["train_loss"][-1])}


NN_SAMPLES, NN_BATCH, NN_PARTICIPATION, NN_GROUPS, NN_CLIENT_GROUP = 50, 10, 0.25, 8, 4


def neural_round(config: dict) -> dict:
  """Runs `config` (n, devices, rounds) of the neural round in this process: data laid out
  over the devices, the round compiled ahead of time, one warm-up round, then `rounds`
  timed rounds, each from the state the previous one left and with its own key."""
  import jax  # here: the parent process never starts JAX

  from fedjax_rep.core import sharding
  from fedjax_rep.nn.hparams import hparams as nn_hparams
  from fedjax_rep.nn.models import make_model
  from fedjax_rep.nn.registry import make_algorithm
  from nn_round import synthetic_data  # benchmarks/ is the script's directory

  n, devices = config["n"], None if config["devices"] == 1 else config["devices"]
  if n % NN_GROUPS or NN_GROUPS % config["devices"]:
    raise ValueError(f"the neural round draws its cohort over {NN_GROUPS} client groups: "
                     f"n={n} must be a multiple of {NN_GROUPS} and devices="
                     f"{config['devices']} a divisor of it")
  cohort = max(NN_GROUPS, round(NN_PARTICIPATION * n))
  algorithm = make_algorithm("fedavg", model=make_model("mlp", 10), cohort=cohort,
                             local_epochs=1, batch_size=NN_BATCH,
                             client_group=NN_CLIENT_GROUP, cohort_groups=NN_GROUPS,
                             devices=devices)
  hparams = nn_hparams(0.01, 0.5, 1e-4)
  start = time.perf_counter()
  data = synthetic_data(jax.random.key(0), n, NN_SAMPLES, (28, 28, 1))
  if devices is not None:
    data = sharding.shard_clients(data, sharding.client_mesh(devices))
  state = jax.block_until_ready(jax.jit(algorithm.init)(jax.random.key(1), data, hparams))
  init_seconds = time.perf_counter() - start
  key = jax.random.key(2)
  start = time.perf_counter()
  round_fn = jax.jit(algorithm.round).lower(state, key, data, hparams).compile()
  times = []
  for t in range(config["rounds"] + 1):  # round 0 warms up
    if t == 1:
      warm_up_seconds = time.perf_counter() - start
    start = time.perf_counter()
    state, metrics = jax.block_until_ready(
        round_fn(state, jax.random.fold_in(key, t), data, hparams))
    times.append(time.perf_counter() - start)
  return {"seconds_per_round": sum(times[1:]) / config["rounds"],
          "init_seconds": init_seconds, "warm_up_seconds": warm_up_seconds,
          "estimate_gb": None, "cohort": cohort,
          "final_train_loss": float(metrics["train_loss"])}


ROUNDS = {"linear": linear_round, "neural": neural_round}
MODES_OF = {"linear": MODES, "neural": ("fixed",)}


def child(config: dict) -> None:
  """The subprocess: runs one configuration and prints its result line."""
  try:
    result = ROUNDS[config["round"]](config)
  except ValueError as error:  # the memory check (or a bad configuration): a row, not a crash
    result = {"error": str(error)}
  result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
  result["device_peak_gb"] = device_peak_gb(config["devices"])
  print(RESULT + json.dumps(result), flush=True)


def device_peak_gb(devices: int) -> float | None:
  """Peak GB allocated on the first `devices` accelerator devices together, or None on the
  CPU (whose allocations peak RSS counts) or where the allocator does not say."""
  from fedjax_rep.linear import memory
  stats = memory.device_stats(devices, "peak_bytes_in_use")
  return None if stats is None else sum(s["peak_bytes_in_use"] for s in stats) / 1e9


def measure(config: dict, timeout: float) -> dict:
  """One configuration in a fresh subprocess on `devices` devices of its platform (emulated
  ones on the CPU)."""
  env = {**os.environ, "JAX_PLATFORMS": config["platform"]}
  if config["platform"] == "cpu":
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={config['devices']}"
  try:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(config)], env=env,
                          capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {**config, "error": f"timed out after {timeout:.0f} s"}
  lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
  if done.returncode or not lines:
    tail = (done.stderr.strip().splitlines() or ["?"])[-1]
    return {**config, "error": f"exit {done.returncode}: {tail}"}
  return {**config, **json.loads(lines[-1][len(RESULT):]), "load_average": os.getloadavg()[0]}


def format_table(rows) -> str:
  header = (f"{'n':>10} {'mode':>16} {'devices':>7} {'s/round':>9} {'init s':>8} "
            f"{'peak RSS GB':>11} {'device GB':>9} {'estimate GB':>11}")
  lines = [header, "-" * len(header)]
  for r in rows:
    if "error" in r and "seconds_per_round" not in r:
      lines.append(f"{r['n']:>10} {r['mode']:>16} {r['devices']:>7}  {r['error']}")
      continue
    lines.append(f"{r['n']:>10} {r['mode']:>16} {r['devices']:>7} "
                 f"{r['seconds_per_round']:>9.3f} {r['init_seconds']:>8.1f} "
                 f"{r['peak_rss_gb']:>11.2f} {gigabytes(r.get('device_peak_gb')):>9} "
                 f"{gigabytes(r['estimate_gb']):>11}")
  return "\n".join(lines)


def gigabytes(value: float | None) -> str:
  return "-" if value is None else f"{value:.2f}"


def integers(text: str) -> list[int]:
  """'1e5,1e6' -> [100000, 1000000]."""
  return [int(float(item)) for item in text.split(",")]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--clients", type=integers, default=[100_000, 1_000_000],
                      help="comma-separated numbers of clients, e.g. 1e5,1e6,1e7")
  parser.add_argument("--mode", help=f"comma-separated data modes among {', '.join(MODES)} "
                      "(default: fresh-statistics; the neural round: fixed)")
  parser.add_argument("--devices", type=integers, default=[1],
                      help="comma-separated device counts, e.g. 1,8")
  parser.add_argument("--rounds", type=int, default=2, help="timed rounds per configuration")
  parser.add_argument("--block", type=int, help="clients per block (default: automatic)")
  parser.add_argument("--round", default="linear", choices=sorted(ROUNDS),
                      help="the kind of round to time")
  parser.add_argument("--platform", default="cpu",
                      help="JAX_PLATFORMS of each configuration's process: cpu (emulated "
                           "devices, the default) or an accelerator's, e.g. cuda")
  parser.add_argument("--timeout", type=float, default=900,
                      help="seconds allowed to one configuration")
  parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    return child(json.loads(args.child))
  modes = (args.mode or ("fixed" if args.round == "neural" else "fresh-statistics")).split(",")
  if any(mode not in MODES_OF[args.round] for mode in modes):
    parser.error(f"--mode of the {args.round} round must be among {MODES_OF[args.round]}, "
                 f"got {args.mode!r}")
  what = (f"FedRep round: d={DIM}, k={REP_DIM}, m={SAMPLES}, full participation"
          if args.round == "linear" else
          f"FedAvg MLP round: {NN_SAMPLES} samples per client, participation "
          f"{NN_PARTICIPATION}, {NN_GROUPS} cohort groups")
  print(f"{what}, {args.rounds} timed rounds on {args.platform}; "
        f"{len(os.sched_getaffinity(0))} cores, "
        f"load average {os.getloadavg()[0]:.2f}")
  rows = []
  for mode in modes:
    for n in args.clients:
      for devices in args.devices:
        config = {"n": n, "mode": mode, "devices": devices, "rounds": args.rounds,
                  "block": args.block, "round": args.round, "platform": args.platform}
        rows.append(measure(config, args.timeout))
        detail = rows[-1].get("estimate")
        print(format_table(rows[-1:]).splitlines()[-1], f"  [{detail}]" if detail else "",
              flush=True)
  print()
  print(format_table(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
