"""Time per FedRep round (linear, full participation) against numpy baselines and a roofline.

One FedRep round over all n clients, with B [d, k] shared:
  Z_i = X_i B;  w_i = (Z_i^T Z_i + lam_i I)^-1 Z_i^T y_i,  lam_i = 1e-6 trace(Z_i^T Z_i) / k + tiny;
  r_i = Z_i w_i - y_i;  g_i = X_i^T r_i w_i^T / m;  B <- B - lr * mean_i g_i.
In "fresh" mode every client first draws X_i ~ N(0, I) [m, d], y_i = X_i B* w_i* + noise;
"fresh-statistics" is the same round with FreshData(sampler="statistics"): each client draws
only A_i = X_i Q [m, 2k] and y_i in the round's basis Q of span[B, B*] (plus one [d, k] draw per
round), the same distribution of the round's outputs.

Three implementations of that round, timed in the same process after warm-up/compilation:
  jax      fedjax_rep's `fr.run` (rounds under lax.scan in jit; it also records the train loss
           and the principal angle every round); with fixed data and fresh-statistics once per
           `--kernels` entry: "xla" (blocks of XLA ops) and "native" (the opt-in C++
           kernels `fedjax_rep.native.fedrep_round`);
  loop     a plain numpy loop over clients (timed on a subset of clients when n is large and
           extrapolated linearly in n);
  batched  numpy on [n, m, d] arrays at once (BLAS matmuls, batched np.linalg.solve).
The roofline time of a round is the larger of reading X and y once at the measured memory
bandwidth and 4 n m d k flops at the measured matmul rate; in the fresh modes it is the time to
draw the normals that mode needs at the measured rate of the fastest of jax.random.normal,
fedjax_rep's bit-identical unrolled generator (`core.normals.normal`) and, for
fresh-statistics, the two-per-hash generator its sampler uses (`normals.normal_pairs`):
n m (d + 1) (fresh), n m (2k + 1) + d k (fresh-statistics), or the compute bound if
larger (the C++ fresh round draws the same normals faster than these generators, so it can
pass that "roofline"). The numpy baselines of both fresh modes draw X_i [m, d] directly.
A last table gives, per n and kernel, the fresh-statistics round's time over the fixed one's.

  python benchmarks/linear_round.py            # n in 1000, 10000, 100000
  python benchmarks/linear_round.py --quick    # n in 1000, 10000, fewer repetitions
  python benchmarks/linear_round.py --sizes 1000 50000
  python benchmarks/linear_round.py --sizes 100000 --json rows.json   # rows: n, mode, kernel,
                                                                      # ms_per_round,
                                                                      # fraction_of_roofline, ...
  python benchmarks/linear_round.py --sizes 100000 --modes fixed fresh-statistics --kernels native
"""

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import resource
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

import fedjax_rep as fr
from fedjax_rep.core import normals

DIM, REP_DIM, SAMPLES = 50, 5, 10  # d, k, m
NOISE_STD = math.sqrt(1e-3)
LR = 0.1
RIDGE = 1e-6  # the heads' relative ridge, as in fedjax_rep.linear.heads
TINY = np.finfo(np.float32).tiny
MODES = ("fixed", "fresh", "fresh-statistics")
FULL_SIZES = (1000, 10000, 100000)
QUICK_SIZES = (1000, 10000)
TOLERANCE = 1e-4  # relative error in B after one round, numpy vs JAX
UPDATE_TOLERANCE = 1e-3  # relative error in the update B - B0 after one round


# --- numpy FedRep rounds -------------------------------------------------------------------


def numpy_head(Z, y):
  """Least-squares head w [k] of one client: Z [m, k], y [m]."""
  G = Z.T @ Z
  lam = RIDGE * np.trace(G) / REP_DIM + TINY
  return np.linalg.solve(G + lam * np.eye(REP_DIM, dtype=G.dtype), Z.T @ y)


def loop_round(B, client_batch, num_clients):
  """New B after one round by a Python loop over clients 0..num_clients-1.

  client_batch(i) returns client i's (X_i [m, d], y_i [m]).
  """
  grad = np.zeros_like(B)
  for i in range(num_clients):
    X, y = client_batch(i)
    Z = X @ B
    w = numpy_head(Z, y)
    residual = Z @ w - y
    grad += X.T @ (residual[:, None] * w[None, :]) / len(y)
  return B - LR * grad / num_clients


def batched_round(B, X, y):
  """New B after one round over all clients at once: X [n, m, d], y [n, m]."""
  n, m, d = X.shape
  Z = (X.reshape(-1, d) @ B).reshape(n, m, -1)
  Zt = Z.transpose(0, 2, 1)
  G = Zt @ Z
  lam = RIDGE * np.trace(G, axis1=1, axis2=2) / REP_DIM + TINY
  A = G + lam[:, None, None] * np.eye(REP_DIM, dtype=G.dtype)
  w = np.linalg.solve(A, Zt @ y[..., None])[..., 0]
  residual = (Z @ w[..., None])[..., 0] - y
  grad = X.reshape(-1, d).T @ (residual[..., None] * w[:, None, :]).reshape(-1, w.shape[1])
  return B - LR * grad / (n * m)


class NumpyFreshData:
  """Fresh client data drawn with numpy (float32 standard normals) from the ground truth."""

  def __init__(self, problem, seed=0):
    self.thetas = np.asarray(problem.W_star @ problem.B_star.T)  # theta_i* = B* w_i*  [n, d]
    self.rng = np.random.default_rng(seed)

  def client(self, i):
    """m fresh samples (X_i [m, d], y_i [m]) of client i."""
    X = self.rng.standard_normal((SAMPLES, DIM), dtype=np.float32)
    noise = self.rng.standard_normal(SAMPLES, dtype=np.float32)
    return X, X @ self.thetas[i] + NOISE_STD * noise

  def all_clients(self):
    """m fresh samples of every client: X [n, m, d], y [n, m]."""
    n = len(self.thetas)
    X = self.rng.standard_normal((n, SAMPLES, DIM), dtype=np.float32)
    noise = self.rng.standard_normal((n, SAMPLES), dtype=np.float32)
    return X, (X @ self.thetas[:, :, None])[..., 0] + NOISE_STD * noise


# --- timing --------------------------------------------------------------------------------


def seconds_per_call(fn, min_seconds, repeats):
  """Best over `repeats` of the mean time of fn() over enough calls to last min_seconds."""
  fn()  # warm-up (and compilation for jitted functions)
  calls, best = 1, math.inf
  for _ in range(repeats):
    while True:
      start = time.perf_counter()
      for _ in range(calls):
        fn()
      elapsed = time.perf_counter() - start
      if elapsed >= min_seconds:
        break
      calls = math.ceil(calls * 1.2 * min_seconds / max(elapsed, 1e-6))
    best = min(best, elapsed / calls)
  return best


def jax_seconds_per_round(run, min_seconds, repeats):
  """(seconds per round, seconds per call beyond its rounds) of `fr.run`.

  Calls of R and 5R rounds (R = max(10, 100000 / n)), each one chunk (one compiled scan)
  from the already computed initial state, are timed after a first call compiles them; the
  round is the difference over the 4R rounds more, the call's own cost (its input checks on
  the host, a copy of the state, fetching the metrics) the rest of the R-round call.
  """
  rounds = max(10, 100_000 // run.alg.cohort)
  key = jax.random.key(2)
  seconds = {}
  for r in (rounds, 5 * rounds):
    call = lambda r=r: fr.run(run.alg, run.data, run.hp, key, num_rounds=r, chunk=r,
                              state=run.state, progress=False)
    seconds[r] = seconds_per_call(call, min_seconds, repeats)
  per_round = (seconds[5 * rounds] - seconds[rounds]) / (4 * rounds)
  return per_round, seconds[rounds] - rounds * per_round


# --- roofline ------------------------------------------------------------------------------


def machine_rates(repeats):
  """Measured float32 matmul GFLOP/s, JAX read GB/s and numpy copy GB/s (read + write)."""
  size = 2048
  a = jax.random.normal(jax.random.key(0), (size, size))
  matmul = jax.jit(lambda a, b: a @ b)
  matmul_s = seconds_per_call(lambda: matmul(a, a).block_until_ready(), 0.2, repeats)
  big = jnp.ones((100_000_000,), jnp.float32)  # 400 MB
  total = jax.jit(jnp.sum)
  read_s = seconds_per_call(lambda: total(big).block_until_ready(), 0.2, repeats)
  src = np.ones(100_000_000, np.float32)
  dst = np.empty_like(src)
  copy_s = seconds_per_call(lambda: np.copyto(dst, src), 0.2, repeats)
  return {"gflops": 2 * size**3 / matmul_s / 1e9, "read_gbs": src.nbytes / read_s / 1e9,
          "copy_gbs": 2 * src.nbytes / copy_s / 1e9}


def normal_rate(num_clients, mode, repeats):
  """Standard normals per second: the fastest of jax.random.normal, the bit-identical
  `fedjax_rep.core.normals.normal` (Threefry unrolled, what the direct sampler uses) and,
  for "fresh-statistics", `normals.normal_pairs` (two normals per hash, what that sampler
  uses), each drawing one round's X [n, m, d] at once."""
  shape = (num_clients, SAMPLES, DIM)
  key = jax.random.key(0)
  draws = [jax.random.normal, normals.normal]
  if mode == "fresh-statistics":
    draws.append(lambda key, shape: normals.normal_pairs(key, math.prod(shape)))
  rates = []
  for draw in draws:
    jitted = jax.jit(lambda key: draw(key, shape))
    seconds = seconds_per_call(lambda: jitted(key).block_until_ready(), 0.2, repeats)
    rates.append(math.prod(shape) / seconds)
  return max(rates)


def normals_per_round(num_clients, mode):
  """Standard normals one round of `mode` draws: X and y, or A [m, 2k], y and H [d, k]."""
  if mode == "fresh-statistics":
    return num_clients * SAMPLES * (2 * REP_DIM + 1) + DIM * REP_DIM
  return num_clients * SAMPLES * (DIM + 1)


def roofline_seconds(num_clients, mode, rates, normals_per_s):
  """(seconds, bound) of the round's lower bound: reading X and y once (fixed), drawing the
  mode's normals (fresh modes), or the flops of X B and X^T R if larger."""
  bounds = {"compute": 4 * num_clients * SAMPLES * DIM * REP_DIM / (rates["gflops"] * 1e9)}
  if mode == "fixed":
    bounds["memory"] = 4 * num_clients * SAMPLES * (DIM + 1) / (rates["read_gbs"] * 1e9)
  else:
    bounds["rng"] = normals_per_round(num_clients, mode) / normals_per_s
  bound = max(bounds, key=bounds.get)
  return bounds[bound], bound


# --- the benchmark -------------------------------------------------------------------------


class Run(NamedTuple):
  """A full-participation FedRep run of fedjax_rep, ready to go (initial state computed)."""
  alg: fr.FedRep
  data: fr.FixedData | fr.FreshData
  hp: fr.LinearHparams
  state: fr.RepState
  problem: fr.LinearProblem


def setup(num_clients, mode, block=None, kernel="xla"):
  """The JAX run of `num_clients` clients with "fixed", "fresh" or "fresh-statistics" data,
  in blocks of `block` clients (None: automatic), with `kernel` ("xla" or "native"; fresh
  runs "xla")."""
  problem = fr.make_problem(jax.random.key(0), num_clients, DIM, REP_DIM, NOISE_STD)
  if mode == "fixed":
    data = fr.make_fixed_data(jax.random.key(1), problem, SAMPLES)
  else:
    data = fr.FreshData(problem, SAMPLES,
                        sampler="statistics" if mode == "fresh-statistics" else "direct")
  alg = fr.FedRep(rep_dim=REP_DIM, cohort=num_clients, block=block, kernel=kernel)
  hp = fr.LinearHparams(lr=jnp.float32(LR), head_lr=jnp.float32(LR))
  state = jax.block_until_ready(fr.init_state(alg, data, hp, jax.random.key(2)))
  return Run(alg, data, hp, state, problem)


def check_against_numpy(run):
  """Asserts that JAX, batched numpy and the numpy loop agree on B after one round of `run`
  (fixed data), from the same B0 and data. Returns the largest relative errors vs JAX of B
  and of the update B - B0.
  """
  B_jax = np.asarray(fr.run(run.alg, run.data, run.hp, jax.random.key(2), num_rounds=1,
                            state=run.state, progress=False).state.B)
  X, y, B0 = np.asarray(run.data.X), np.asarray(run.data.y), np.asarray(run.state.B)
  errors_B, errors_update = [], []
  for name, B in (("batched", batched_round(B0, X, y)),
                  ("loop", loop_round(B0, lambda i: (X[i], y[i]), len(X)))):
    errors_B.append(np.linalg.norm(B - B_jax) / np.linalg.norm(B_jax))
    errors_update.append(np.linalg.norm(B - B_jax) / np.linalg.norm(B_jax - B0))
    assert errors_B[-1] < TOLERANCE and errors_update[-1] < UPDATE_TOLERANCE, (
        f"numpy {name} and JAX disagree after one round: relative error of B "
        f"{errors_B[-1]:.1e}, of the update {errors_update[-1]:.1e}")
  return max(errors_B), max(errors_update)


def benchmark(run, mode, rates, min_seconds, repeats, max_loop_clients):
  """One table row: seconds per round of each implementation and the roofline."""
  n = run.alg.cohort
  B0 = np.asarray(run.state.B)
  if mode == "fixed":
    X, y = np.asarray(run.data.X), np.asarray(run.data.y)
    client_batch = lambda i: (X[i], y[i])
    batched = lambda: batched_round(B0, X, y)
  else:
    fresh = NumpyFreshData(run.problem)
    client_batch = fresh.client
    batched = lambda: batched_round(B0, *fresh.all_clients())
  loop_clients = min(n, max_loop_clients)
  loop_s = seconds_per_call(lambda: loop_round(B0, client_batch, loop_clients), min_seconds,
                            1) * n / loop_clients
  batched_s = seconds_per_call(batched, min_seconds, repeats)
  jax_s, call_s = jax_seconds_per_round(run, min_seconds, repeats)
  normals_per_s = normal_rate(n, mode, repeats) if mode != "fixed" else None
  roof_s, bound = roofline_seconds(n, mode, rates, normals_per_s)
  return {"n": n, "mode": mode, "kernel": run.alg.kernel, "jax": jax_s, "call": call_s,
          "loop": loop_s, "batched": batched_s,
          "extrapolated": loop_clients < n, "roofline": roof_s, "bound": bound,
          "normals_per_s": normals_per_s}


def now() -> str:
  """The time and the load averages (1, 5, 15 min), for the log."""
  return (f"{datetime.datetime.now().isoformat(timespec='seconds')}; load average "
          f"(1, 5, 15 min) {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def write_json(path: str, data) -> None:
  """`data` written to `path` as indented JSON, and a line saying so."""
  with open(path, "w") as f:
    json.dump(data, f, indent=1)
  print(f"wrote {path}")


def check_positive(parser, args, names, lists=()) -> None:
  """parser.error naming the first of the integer options `names` (and of the list options
  `lists`, each item) that is below 1."""
  for name in names:
    if getattr(args, name) < 1:
      parser.error(f"--{name.replace('_', '-')} must be >= 1")
  for name in lists:
    if min(getattr(args, name)) < 1:
      parser.error(f"--{name.replace('_', '-')} must be >= 1")


def report(rows, table: str, json_path: str | None) -> None:
  """The end of a benchmark's log: when it finished, the table of `rows`, and the rows
  written to `json_path` (as JSON) where given."""
  print(f"\nfinished {now()}\n")
  print(table)
  if json_path:
    write_json(json_path, rows)


def peak_rss_bytes() -> int:
  """This process's peak resident set size so far (bytes): VmHWM of /proc/self/status,
  the peak of its own address space (Linux's ru_maxrss also counts the parent's at the
  fork), else ru_maxrss where there is no /proc."""
  with contextlib.suppress(OSError), open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) * 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def machine_info():
  """Lines describing the CPU, core count and library versions."""
  cpu = platform.processor() or "unknown"
  with open("/proc/cpuinfo") as f:
    for line in f:
      if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
  return [f"CPU: {cpu}; {len(os.sched_getaffinity(0))} cores usable "
          f"(os.cpu_count() = {os.cpu_count()})",
          f"python {platform.python_version()}, jax {jax.__version__}, "
          f"jaxlib {jaxlib.__version__}, numpy {np.__version__}",
          f"jax devices: {jax.devices()}"]


def format_table(rows):
  """The results as a fixed-width text table."""
  header = (f"{'n':>7} {'mode':>16} {'kernel':>6} {'jax ms':>9} {'loop ms':>10} {'batched ms':>10} "
            f"{'x loop':>7} {'x batched':>9} {'roofline ms':>11} {'bound':>7} {'of roof':>7}")
  lines = [header, "-" * len(header)]
  for r in rows:
    loop = f"{r['loop'] * 1e3:.1f}" + ("*" if r["extrapolated"] else "")
    lines.append(
        f"{r['n']:>7} {r['mode']:>16} {r['kernel']:>6} {r['jax'] * 1e3:>9.2f} {loop:>10} "
        f"{r['batched'] * 1e3:>10.2f} {r['loop'] / r['jax']:>7.1f} "
        f"{r['batched'] / r['jax']:>9.2f} {r['roofline'] * 1e3:>11.2f} {r['bound']:>7} "
        f"{r['roofline'] / r['jax']:>7.0%}")
  return "\n".join(lines)


def format_ratios(rows):
  """Per n and kernel, the fresh-statistics round's time over the fixed round's (and over the
  XLA fixed round's), where both were timed."""
  fixed = {(r["n"], r["kernel"]): r["jax"] for r in rows if r["mode"] == "fixed"}
  lines = [f"{'n':>7} {'kernel':>6} {'fresh-statistics / fixed':>25} {'/ fixed xla':>12}"]
  for r in rows:
    if r["mode"] == "fresh-statistics" and (r["n"], r["kernel"]) in fixed:
      xla = fixed.get((r["n"], "xla"))
      over_xla = "" if xla is None else f"{r['jax'] / xla:.2f}"
      lines.append(f"{r['n']:>7} {r['kernel']:>6} {r['jax'] / fixed[r['n'], r['kernel']]:>25.2f} "
                   f"{over_xla:>12}")
  return "\n".join(lines) if len(lines) > 1 else ""


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true",
                      help="n in 1000, 10000 only, fewer repetitions (well under a minute)")
  parser.add_argument("--sizes", type=int, nargs="+", help="numbers of clients n to time")
  parser.add_argument("--modes", nargs="+", choices=MODES, default=MODES,
                      help="data modes to time (default all)")
  parser.add_argument("--block", type=int, help="clients per block (default: automatic)")
  parser.add_argument("--kernels", default="xla,native",
                      help="comma-separated kernels of the fixed and fresh-statistics "
                           "rounds: xla, native (default both)")
  parser.add_argument("--precision", choices=("highest", "default"), default="highest",
                      help="jax's default matmul precision: highest (float32 products, the "
                           "default) or default (on a GPU TF32 products, whose round-off "
                           "fails the check against numpy: update error 5e-3 on an H200)")
  parser.add_argument("--json", metavar="PATH",
                      help="also write the rows as JSON (n, mode, ms_per_round, "
                           "fraction_of_roofline, roofline_ms, bound, load_average, ...)")
  args = parser.parse_args()
  jax.config.update("jax_default_matmul_precision", args.precision)
  sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
  min_seconds, repeats, max_loop_clients = (0.1, 2, 1000) if args.quick else (0.5, 3, 10000)

  print("\n".join(machine_info()))
  print(f"FedRep round: d={DIM}, k={REP_DIM}, m={SAMPLES}, full participation, float32 "
        f"(matmul precision {args.precision})")
  rates = machine_rates(repeats)
  print(f"roofline: matmul {rates['gflops']:.0f} GFLOP/s (jax, 2048^3), read "
        f"{rates['read_gbs']:.1f} GB/s (jax sum of 400 MB), numpy copy "
        f"{rates['copy_gbs']:.1f} GB/s (read + write)")
  kernels = args.kernels.split(",")
  if not set(kernels) <= {"xla", "native"}:
    parser.error(f"--kernels takes xla and/or native, got {args.kernels!r}")
  rows = []
  for n in sizes:
    for mode in args.modes:
      for kernel in kernels if mode != "fresh" else ["xla"]:
        run = setup(n, mode, args.block, kernel)
        if mode == "fixed" and n == min(sizes):
          error_B, error_update = check_against_numpy(run)
          print(f"check (n={n}, fixed data, {kernel}, 1 round, numpy batched and loop vs "
                f"JAX): relative error of B {error_B:.1e}, of the update B - B0 "
                f"{error_update:.1e}")
        rows.append(benchmark(run, mode, rates, min_seconds, repeats, max_loop_clients))
        rows[-1]["load_average"] = os.getloadavg()[0]
        if mode != "fixed":
          print(f"n={n} ({mode}): normals {rows[-1]['normals_per_s'] / 1e6:.0f} M "
                f"samples/s, {normals_per_round(n, mode) / n:.0f} normals per client")
  print()
  print(format_table(rows))
  if any(r["extrapolated"] for r in rows):
    print(f"* loop timed on the first {max_loop_clients} clients, extrapolated linearly in n")
  print(format_ratios(rows))
  loads = ", ".join(f"{r['load_average']:.2f}" for r in rows)
  print(f"load average (1 min) after each row: {loads}")
  if args.json:
    write_json(args.json, {"machine": machine_info(), "rates": rates, "rows": records(rows)})


def records(rows) -> list[dict]:
  """The rows for the JSON file (times in ms)."""
  return [{"n": r["n"], "mode": r["mode"], "kernel": r["kernel"], "ms_per_round": r["jax"] * 1e3,
           "ms_per_call_beyond_rounds": r["call"] * 1e3,
           "fraction_of_roofline": r["roofline"] / r["jax"], "roofline_ms": r["roofline"] * 1e3,
           "bound": r["bound"], "loop_ms": r["loop"] * 1e3, "batched_ms": r["batched"] * 1e3,
           "normals_per_s": r["normals_per_s"], "load_average": r["load_average"]}
          for r in rows]


if __name__ == "__main__":
  main()
