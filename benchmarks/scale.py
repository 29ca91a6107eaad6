"""Seconds per round and peak memory of FedRep rounds from 10^5 to 10^7 clients, and of the
neural round (`--round neural`), on 1 or 8 (emulated) devices.

Each configuration (clients n, data mode, devices) runs in its own subprocess, so its peak
resident memory (ru_maxrss of that process) is its own; the number of devices is set
there through XLA_FLAGS=--xla_force_host_platform_device_count=D, after the caller's own
XLA_FLAGS (emulated CPU devices share this machine's cores: more devices is a check of the
sharded program, not a speed-up here). With `--platform cuda` (any JAX_PLATFORMS value
but cpu) the subprocess runs on that accelerator's real devices instead, and the table
adds their peak memory (the allocator's peak_bytes_in_use, summed over the devices used).
Next to the measured peak the table prints `fedjax_rep.linear.memory`'s estimate. A
configuration that cannot fit stops in its subprocess with the memory check's one-line
error, shown in the table.

`--processes P` (CPU only) runs a configuration of D devices in all as a job of P local
processes under JAX's multi-controller runtime instead of one process: process i gets
JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT (a free loopback port), NUM_PROCESSES=P,
PROCESS_ID=i and D/P emulated devices (D must be a multiple of P; with `--devices 1` a
job of P processes has one device each, D = P), joins the job
(`fedjax_rep.core.distributed.join`) before anything else uses JAX, and runs the same
round with devices = len(jax.devices()), all processes' devices: the client axis is split
over the processes by shard_map and the server's sums are a psum over gloo. Every
process builds the same data from the same seeds. Each process is pinned
(os.sched_setaffinity) to its share of the cores this script may use: the cores split
into P contiguous, even shares, or, with more processes than cores, core i mod C for
process i (processes then share cores). The row's seconds per round (and init and
warm-up seconds) are the maximum over the processes, its peak RSS the largest process's
(peak_rss_gb_total: their sum, what the estimate, made for one process holding the whole
job, compares with) and its final metric process 0's (every process holds the same,
replicated). If a process fails, or the timeout passes, every process of the job is
killed. P = 1 is the plain single process (no job variables, all cores).

  python benchmarks/scale.py --clients 1e5,1e6,1e7 --mode fresh --rounds 2 --json rows.json
  python benchmarks/scale.py --clients 1e5,1e6 --mode fresh-statistics --devices 1,8
  python benchmarks/scale.py --clients 1e6 --devices 1 --processes 1,2,4

Rows (--json): n, mode, devices (in all, over every process), processes, round, platform,
seconds_per_round, init_seconds, warm_up_seconds (compilation + two rounds), peak_rss_gb,
peak_rss_gb_total, seconds_per_round_each (a job's per-process seconds), device_peak_gb
(None on the CPU), estimate_gb, final_metric (the principal angle between the learnt and
the true representation after the last round; neural: the last round's train loss),
final_train_loss, load_average (1-minute, when the configuration ended), error.
Modes: fixed (X [n, m, d] in memory), fresh (direct samples), fresh-statistics
(FreshData(sampler="statistics")). `--round` picks an entry of ROUNDS, a function(config) ->
dict of timings run in the subprocess:

- linear: FedRep, d=50, k=5, m=10, full participation, `devices` > 1 sharded
  (FedRep(devices=...)).
- neural: FedAvg (`fedjax_rep.nn.algorithms`) with a cohort of a quarter of the n clients,
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
import tempfile
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
          "final_metric": float(timed.metrics["principal_angle"][-1]),
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
  from fedjax_rep.nn.algorithms import make_algorithm
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
          "final_metric": float(metrics["train_loss"]),
          "final_train_loss": float(metrics["train_loss"])}


ROUNDS = {"linear": linear_round, "neural": neural_round}
MODES_OF = {"linear": MODES, "neural": ("fixed",)}


def child(config: dict) -> None:
  """The subprocess (one process of a job of `processes`): pins itself to its cores, joins
  the job if there is one, runs one configuration on `devices` devices (a job: all its
  processes' devices, len(jax.devices())) and prints its result line."""
  if config.get("cpus"):
    os.sched_setaffinity(0, config["cpus"])
  if config.get("processes", 1) > 1:
    from fedjax_rep.core import distributed  # before anything else uses JAX
    distributed.join()
    import jax
    if len(jax.devices()) != config["devices"]:  # the round runs on all the job's devices
      raise RuntimeError(f"the job has {len(jax.devices())} devices, expected "
                         f"{config['devices']}")
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
  from fedjax_rep.core import memory
  stats = memory.device_stats(devices, "peak_bytes_in_use")
  return None if stats is None else sum(s["peak_bytes_in_use"] for s in stats) / 1e9


def process_cpus(processes: int, cpus=None) -> list[list[int]]:
  """The cores of each of `processes` processes: `cpus` (default: those this process may
  use) in contiguous, even shares, or with more processes than cores, core i mod C for
  process i."""
  cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
  if processes > len(cpus):
    return [[cpus[i % len(cpus)]] for i in range(processes)]
  return [cpus[i * len(cpus) // processes:(i + 1) * len(cpus) // processes]
          for i in range(processes)]


def job_environments(config: dict) -> list[dict]:
  """os.environ of each process of `config`'s job: its platform and, on the CPU, its share
  of the emulated devices (after the caller's XLA_FLAGS); with processes > 1 also the
  job's variables (one free loopback port for all)."""
  processes = config["processes"]
  env = {**os.environ, "JAX_PLATFORMS": config["platform"]}
  if config["platform"] == "cpu":
    flags = [flag for flag in env.get("XLA_FLAGS", "").split()
             if not flag.startswith("--xla_force_host_platform_device_count")]
    flags.append(f"--xla_force_host_platform_device_count={config['devices'] // processes}")
    env["XLA_FLAGS"] = " ".join(flags)
  if processes == 1:
    return [env]
  from fedjax_rep.core.distributed import free_port
  address = f"127.0.0.1:{free_port()}"
  return [{**env, "JAX_COORDINATOR_ADDRESS": address, "NUM_PROCESSES": str(processes),
           "PROCESS_ID": str(i)} for i in range(processes)]


def measure(config: dict, timeout: float) -> dict:
  """One configuration in fresh subprocesses: a job of `processes` processes on `devices`
  devices in all (emulated ones on the CPU), each pinned to its cores (all of them for one
  process). If one process fails or `timeout` seconds pass, every process is killed."""
  processes = config["processes"]
  cpus = process_cpus(processes) if processes > 1 else [None]
  with tempfile.TemporaryDirectory(prefix="scale-") as folder:
    runs, logs = [], []
    try:
      for i, env in enumerate(job_environments(config)):
        logs.append([os.path.join(folder, f"{i}.{kind}") for kind in ("out", "err")])
        with open(logs[-1][0], "w") as out, open(logs[-1][1], "w") as err:
          runs.append(subprocess.Popen(  # the child keeps its own copies of the files
              [sys.executable, __file__, "--child", json.dumps({**config, "cpus": cpus[i]})],
              env=env, stdout=out, stderr=err))
      ended = wait_all(runs, time.monotonic() + timeout)
    finally:
      killed = set()
      for i, run in enumerate(runs):  # no orphans: a job ends whole, or all of it is stopped
        if run.poll() is None:
          run.kill()
          killed.add(i)
        run.wait()
    if not ended:
      return {**config, "error": f"timed out after {timeout:.0f} s"}
    results = []
    # A process that failed by itself first, then those stopped because of it.
    order = sorted(range(len(runs)), key=lambda i: i in killed)
    for i, run, (out, err) in ((i, runs[i], logs[i]) for i in order):
      with open(out) as f:
        lines = [line for line in f.read().splitlines() if line.startswith(RESULT)]
      if run.returncode or not lines:
        with open(err) as f:
          tail = (f.read().strip().splitlines() or ["?"])[-1]
        where = f"process {i}: " if processes > 1 else ""
        return {**config, "error": f"{where}exit {run.returncode}: {tail}"}
      results.append(json.loads(lines[-1][len(RESULT):]))  # in process order: none killed
  return {**config, **combine(results), "load_average": os.getloadavg()[0]}


def wait_all(runs, deadline: float) -> bool:
  """Waits until every process of `runs` has ended or one has failed (True), or until
  `deadline` (False); the caller kills what still runs."""
  while True:
    codes = [run.poll() for run in runs]
    if any(codes) or all(code is not None for code in codes):
      return True
    if time.monotonic() > deadline:
      return False
    time.sleep(0.2)


def combine(results: list[dict]) -> dict:
  """One row of a job's per-process results: process 0's, with the maximum over processes
  of the seconds and of peak RSS, and the sum of the peak RSS (peak_rss_gb_total)."""
  row = dict(results[0])
  errors = [r["error"] for r in results if "error" in r]
  if errors:
    return {"error": errors[0]}
  for name in ("seconds_per_round", "init_seconds", "warm_up_seconds", "peak_rss_gb"):
    row[name] = max(r[name] for r in results)
  row["peak_rss_gb_total"] = sum(r["peak_rss_gb"] for r in results)
  if len(results) > 1:
    row["seconds_per_round_each"] = [r["seconds_per_round"] for r in results]
  return row


def format_table(rows) -> str:
  header = (f"{'n':>10} {'mode':>16} {'devices':>7} {'procs':>5} {'s/round':>9} "
            f"{'init s':>8} {'peak RSS GB':>11} {'device GB':>9} {'estimate GB':>11} "
            f"{'final':>10} {'load':>5}")
  lines = [header, "-" * len(header)]
  for r in rows:
    start = f"{r['n']:>10} {r['mode']:>16} {r['devices']:>7} {r['processes']:>5}"
    if "error" in r and "seconds_per_round" not in r:
      lines.append(f"{start}  {r['error']}")
      continue
    lines.append(f"{start} {r['seconds_per_round']:>9.3f} {r['init_seconds']:>8.1f} "
                 f"{r['peak_rss_gb']:>11.2f} {gigabytes(r.get('device_peak_gb')):>9} "
                 f"{gigabytes(r['estimate_gb']):>11} {r['final_metric']:>10.6g} "
                 f"{r['load_average']:>5.2f}")
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
                      help="comma-separated device counts (in all, over the processes), "
                           "e.g. 1,8")
  parser.add_argument("--processes", type=integers, default=[1],
                      help="comma-separated process counts, e.g. 1,2,4: P > 1 runs each "
                           "configuration as a job of P local processes under JAX's "
                           "multi-controller runtime, D/P devices each (--devices 1: one "
                           "device each); CPU only")
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
  if any(p < 1 for p in args.processes) or any(d < 1 for d in args.devices):
    parser.error("--devices and --processes must be >= 1")
  if args.platform != "cpu" and max(args.processes) > 1:
    parser.error("--processes > 1 runs on the CPU only (--platform cpu)")
  jobs = []  # (devices in all, processes)
  for devices in args.devices:
    for processes in args.processes:
      total = processes if devices == 1 else devices
      if total % processes:
        parser.error(f"--devices {devices} is not a multiple of --processes {processes}: "
                     "every process of a job gets the same number of devices")
      jobs.append((total, processes))
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
      for devices, processes in jobs:
        config = {"n": n, "mode": mode, "devices": devices, "processes": processes,
                  "rounds": args.rounds, "block": args.block, "round": args.round,
                  "platform": args.platform}
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
