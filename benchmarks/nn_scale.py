"""Seconds per round and peak memory of neural FedRep on clients of natural, heavy-tailed sizes.

Three federations, each held at its clients' natural sizes in a flat store (`data.flat`):
  synthetic  LEAF/FedProx Synthetic(1, 1) (`data.synthetic`): n = --clients clients of
             UNCAPPED sizes int(LogNormal(4, 2)) + 50, 80/20 train/test (as table1-synthetic);
             model `synthetic-mlp`;
  femnist    FEMNIST-shaped: 3,597 writers whose sizes are log-normal with FEMNIST's moments
             (LEAF: 227 +- 89 samples per writer), at least 2, 90/10 train/test; random
             28x28x1 images whose brightness depends on the label (62 classes); model `mlp`;
  sent140    Sent140-shaped: 10^5 users whose sizes are 2 + int(a log-normal with Sent140's
             moments, LEAF: 2.42 +- 4.71 tweets per user), 90/10 train/test (at least one
             of each); random token ids [25] of a 10,000-word vocabulary, 2 classes; model
             `sent140-lstm`.
Participation 0.01 and FedRep's round of table1-synthetic (10 head epochs then 1 body epoch,
batch 10, lr 0.05, momentum 0.5, weight decay 1e-4, client groups of --client-group, 10 by
default), against two
baselines measured in the same run on the same cohorts:
  raw     the size of the data in memory: every client's train and test samples once;
  loop    as PFLlib / FL-bench run clients: a Python loop over the cohort, each client one
          call of the jitted FedRep client update on its own data (zero-padded to its size
          class, `flat.class_rows`, so one compile per class), which runs exactly its own
          11 ceil(m_i / 10) SGD steps, then the count-weighted average of the bodies.
  engine  `jax.jit(alg.round)` of the registered `fedrep` on the flat store: the cohort
          trained by size classes, each client its own steps (`data.flat.map_clients`).
Each (federation, n, implementation) runs in a fresh subprocess (peak RSS is a
process-lifetime peak): the same round keys, hence the same cohorts
(`core.cohort.sample_cohort`) and client keys, one untimed warm-up round after compiling,
then --rounds timed rounds (their mean). The final bodies of the two are compared (relative
error of the params and of their update). The model computes at `--precision` (`make_model`'s:
float32, the default, runs every matmul and conv at float32 on every backend; tf32 at jax's
default matmul precision, TF32 on NVIDIA GPUs that have it; bf16 mixed precision); each row
names it.

  python benchmarks/nn_scale.py --clients 1000 20000 --json /tmp/nn_scale.json
  python benchmarks/nn_scale.py --quick     # small n of each federation, 2 rounds: a smoke test
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import types

import jax
import jax.numpy as jnp
import numpy as np

# benchmarks/ is the script's directory
from linear_round import machine_info, now, peak_rss_bytes, report
from fedjax_rep.core.cohort import cohort_size, sample_cohort
from fedjax_rep.data import flat
from fedjax_rep.data import synthetic
from fedjax_rep.nn.hparams import hparams as nn_hparams
from fedjax_rep.nn.models import PRECISIONS, make_model
from fedjax_rep.nn.algorithms import make_algorithm

PARTICIPATION = 0.01
HEAD_EPOCHS, LOCAL_EPOCHS, BATCH = 10, 1, 10
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.5, 1e-4
ALPHA, BETA = 1.0, 1.0  # Synthetic(1, 1)
SYNTHETIC_TEST_FRACTION = 0.2  # table1-synthetic's
VOCAB, TWEET_LENGTH = 10_000, 25


@dataclasses.dataclass(frozen=True)
class Federation:
  """A federation's model and one sample's input: shape, dtype and bytes with its label."""
  name: str
  model: str
  classes: int
  input_shape: tuple
  input_dtype: type = np.float32
  clients: int | None = None  # its number of clients (None: --clients)
  quick_clients: tuple = ()

  @property
  def row_bytes(self) -> int:
    return int(np.prod(self.input_shape)) * np.dtype(self.input_dtype).itemsize + 4


FEDERATIONS = {
    "synthetic": Federation("synthetic", "synthetic-mlp", 10, (60,), quick_clients=(100, 200)),
    "femnist": Federation("femnist", "mlp", 62, (28, 28, 1), clients=3597,
                          quick_clients=(200,)),
    "sent140": Federation("sent140", "sent140-lstm", 2, (TWEET_LENGTH,), np.int32,
                          clients=100_000, quick_clients=(1000,)),
}
# log-normal (mu, sigma) with LEAF's mean and std of samples per client
FEMNIST_SIZES = (5.353, 0.378)  # mean 227, std 89
SENT140_SIZES = (0.101, 1.251)  # mean 2.42, std 4.71


# --- the federations -----------------------------------------------------------------------


def lognormal_sizes(moments, n, seed, least):
  """n sizes int(LogNormal(mu, sigma)) + least, drawn from the seed's first stream."""
  rng = np.random.default_rng([seed, 0])
  return rng.lognormal(*moments, n).astype(np.int64) + least


def client_sizes(federation, n, seed):
  """(train rows [n], test rows [n]) of the federation's n clients, as `generate` draws
  them (Synthetic: as `synthetic.generate` draws and `synthetic.federated` splits them)."""
  if federation.name == "synthetic":
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(synthetic.SIZE_MEAN, synthetic.SIZE_SIGMA, n).astype(np.int64)
    sizes += synthetic.SIZE_MIN
    test_fraction = SYNTHETIC_TEST_FRACTION
  else:
    moments = FEMNIST_SIZES if federation.name == "femnist" else SENT140_SIZES
    sizes = lognormal_sizes(moments, n, seed, least=2)
    test_fraction = 0.1
  train_rows = np.clip((sizes * (1 - test_fraction)).astype(np.int64), 1, sizes - 1)
  return train_rows, sizes - train_rows


def generate(federation, n, seed):
  """(x [N, ...], y [N], train rows [n], test rows [n]): every client's train then test
  samples, one client after another (x 64-byte aligned: placed on the CPU device without a
  copy). The mocks' sizes and contents come from two streams of the seed."""
  train_rows, test_rows = client_sizes(federation, n, seed)
  if federation.name == "synthetic":
    data = synthetic.generate(ALPHA, BETA, n, seed, dim=60, num_classes=10)
    return data["x_rows"], data["y_rows"], train_rows, test_rows
  total = int(train_rows.sum() + test_rows.sum())
  rng = np.random.default_rng([seed, 1])
  x = flat.aligned_empty((total, *federation.input_shape), federation.input_dtype)
  y = rng.integers(0, federation.classes, total).astype(np.int32)
  chunk = 1 << 16
  for start in range(0, total, chunk):
    part = slice(start, min(start + chunk, total))
    if federation.name == "femnist":
      mean = (y[part] / federation.classes)[:, None, None, None]
      x[part] = np.clip(rng.normal(mean, 0.3, (len(y[part]), *federation.input_shape)), 0, 1)
    else:
      x[part] = rng.integers(1, VOCAB, (len(y[part]), *federation.input_shape))
  return x, y, train_rows, test_rows


def memory_estimates(federation, n, seed):
  """{raw_data_bytes, padded_data_bytes, max_size, mean_size} of n clients: the raw bytes
  sum_i (train_i + test_i) x row bytes, the padded layout's n (max train + max test) x
  row bytes (`federated.ClientDatasets`)."""
  train_rows, test_rows = client_sizes(federation, n, seed)
  sizes = train_rows + test_rows
  return {"raw_data_bytes": int(sizes.sum()) * federation.row_bytes,
          "padded_data_bytes": n * int(train_rows.max() + test_rows.max()) * federation.row_bytes,
          "max_size": int(sizes.max()), "mean_size": float(sizes.mean())}


def round_keys(seed, rounds):
  """The keys of the warm-up round and the `rounds` timed ones."""
  return list(jax.random.split(jax.random.key(seed + 1), rounds + 1))


def cohorts(keys, n):
  """The cohort [c] (numpy) of each round key, as `Personalized.round` draws it."""
  size = cohort_size(n, PARTICIPATION)
  return [np.asarray(sample_cohort(jax.random.split(k)[0], n, size)) for k in keys]


def algorithm(federation, n, group, precision="float32"):
  """table1-synthetic's FedRep for the federation's model (at `make_model`'s `precision`)
  and n clients at participation PARTICIPATION, clients trained `group` at a time, and
  hparams."""
  tokens = {"vocab_size": VOCAB} if federation.name == "sent140" else {}
  model = make_model(federation.model, federation.classes, precision=precision, **tokens)
  alg = make_algorithm("fedrep", model=model, cohort=cohort_size(n, PARTICIPATION),
                       local_epochs=LOCAL_EPOCHS, head_epochs=HEAD_EPOCHS, batch_size=BATCH,
                       client_group=group)
  return alg, nn_hparams(LR, MOMENTUM, WEIGHT_DECAY)


# --- the engine (a child process) ----------------------------------------------------------


def run_engine(federation, n, seed, rounds, body_path, group, precision="float32"):
  """The engine on the federation's n clients in a flat store: compile, one warm-up round,
  `rounds` timed rounds; saves the final body to body_path; returns the child's result."""
  x, y, train_rows, test_rows = generate(federation, n, seed)
  starts = np.cumsum(train_rows + test_rows) - train_rows - test_rows
  data = flat.segments(x, y, starts, train_rows, starts + train_rows, test_rows,
                       federation.classes)
  del x, y
  alg, hparams = algorithm(federation, n, group, precision)
  state = jax.block_until_ready(alg.init(jax.random.key(seed + 2), data, hparams))
  initial = state.shared
  keys = round_keys(seed, rounds)
  start = time.perf_counter()
  compiled = jax.jit(alg.round).lower(state, keys[0], data, hparams).compile()
  compile_s = time.perf_counter() - start
  times = []
  for key in keys:
    start = time.perf_counter()
    state, _ = compiled(state, key, data, hparams)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - start)
  save_body(body_path, initial, state.shared)
  return {"seconds_per_round": float(np.mean(times[1:])), "seconds_all": times[1:],
          "compile_seconds": compile_s, "peak_rss_bytes": peak_rss_bytes(),
          "size_classes": [r for r, _, _ in data.classes]}


# --- the per-client loop (a child process) -------------------------------------------------


TRACES = [0]  # times the loop's client function was traced (= compiled)


def padded_rows(a, rows):
  """a [m, ...] zero-padded to `rows` rows."""
  out = np.zeros((rows, *a.shape[1:]), a.dtype)
  out[:len(a)] = a
  return out


def run_loop(federation, n, seed, rounds, body_path, group, precision="float32"):
  """The per-client loop on the federation's n clients (their samples held once, as
  generated): the client update compiled for each size class the cohorts need, one warm-up
  round, `rounds` timed rounds; saves the final body; returns the child's result."""
  x, y, train_rows, test_rows = generate(federation, n, seed)
  starts = np.cumsum(train_rows + test_rows) - train_rows - test_rows
  alg, hparams = algorithm(federation, n, group, precision)
  spec = jax.ShapeDtypeStruct(federation.input_shape, federation.input_dtype)
  shapes = types.SimpleNamespace(input_spec=lambda: spec, num_clients=n)  # what init reads
  state = alg.init(jax.random.key(seed + 2), shapes, hparams)
  body, head0 = state.shared, jax.tree.map(lambda p: p[0], state.personal)
  initial, heads = body, {}
  keys = round_keys(seed, rounds)
  round_cohorts = cohorts(keys, n)
  info = alg.round_info(state, n)

  def client(body, head, x, y, count, key, hparams):
    TRACES[0] += 1
    sent, head, _ = alg.client_update(body, head, x, y, count, key, hparams, info)
    return sent, head

  def accumulate(sums, params, weight):
    return jax.tree.map(lambda s, p: s + weight * p, sums, params)

  start = time.perf_counter()
  compiled = {}
  for size in sorted({flat.class_rows(train_rows[i]) for c in round_cohorts for i in c}):
    compiled[size] = jax.jit(client).lower(
        body, head0, jax.ShapeDtypeStruct((size, *spec.shape), spec.dtype),
        jax.ShapeDtypeStruct((size,), np.int32), np.int32(1), keys[0], hparams).compile()
  add = jax.jit(accumulate).lower(body, body, np.float32(1)).compile()
  compile_s = time.perf_counter() - start
  times = []
  for key, cohort in zip(keys, round_cohorts):
    start = time.perf_counter()
    key_clients = jax.random.split(key)[1]
    sums, total = jax.tree.map(jnp.zeros_like, body), 0.0
    for i in cohort:
      count = int(train_rows[i])
      size = flat.class_rows(count)
      rows = slice(starts[i], starts[i] + count)
      new_body, heads[i] = compiled[size](
          body, heads.get(i, head0), padded_rows(x[rows], size), padded_rows(y[rows], size),
          np.int32(count), jax.random.fold_in(key_clients, i), hparams)
      sums = add(sums, new_body, np.float32(count))
      total += count
    body = jax.block_until_ready(jax.tree.map(lambda s: s / np.float32(total), sums))
    times.append(time.perf_counter() - start)
  save_body(body_path, initial, body)
  steps = sum((HEAD_EPOCHS + LOCAL_EPOCHS) * -(-int(train_rows[i]) // BATCH)
              for c in round_cohorts[1:] for i in c) / max(rounds, 1)
  return {"seconds_per_round": float(np.mean(times[1:])), "seconds_all": times[1:],
          "compile_seconds": compile_s, "peak_rss_bytes": peak_rss_bytes(),
          "steps_per_round": steps, "compiles": TRACES[0], "padded_sizes": sorted(compiled)}


def save_body(path, initial, body):
  """Writes the initial and final body (flat dicts) to the npz file `path`."""
  np.savez(path, **{f"initial:{p}": np.asarray(v) for p, v in initial.items()},
           **{f"final:{p}": np.asarray(v) for p, v in body.items()})


def body_errors(path, reference_path):
  """Largest (over arrays) relative error of the final body in `path` vs `reference_path`,
  and of its update (final - initial)."""
  a, b = np.load(path), np.load(reference_path)
  error = update = 0.0
  for name in b.files:
    if name.startswith("final:"):
      p, r = a[name].astype(np.float64), b[name].astype(np.float64)
      r0 = b["initial:" + name[6:]].astype(np.float64)
      error = max(error, np.linalg.norm(p - r) / np.linalg.norm(r))
      update = max(update, np.linalg.norm(p - r) / max(np.linalg.norm(r - r0), 1e-30))
  return error, update


# --- the parent ----------------------------------------------------------------------------


def child(implementation, federation, n, seed, rounds, body_path, group, precision="float32"):
  """Runs one measurement in a fresh process; its result (a dict), or {'error': text}."""
  run = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", implementation,
                        "--data", federation.name, "--clients", str(n), "--seed", str(seed),
                        "--rounds", str(rounds), "--body", body_path,
                        "--client-group", str(group), "--precision", precision],
                       capture_output=True, text=True)
  if run.returncode != 0:
    return {"error": f"exit {run.returncode}: {run.stderr.strip()[-2000:]}"}
  return json.loads(run.stdout.strip().splitlines()[-1])


def measure(federation, n, seed, rounds, workdir, group, precision="float32"):
  """The row of the federation's n clients: sizes, memory estimates, the engine and the
  loop (both at `precision`), and the loop's error against the engine."""
  row = {"data": federation.name, "n": n, "cohort": cohort_size(n, PARTICIPATION),
         "client_group": group, "rounds": rounds, "precision": precision,
         **memory_estimates(federation, n, seed)}
  loop_body, engine_body = (os.path.join(workdir, f"{name}-{federation.name}-{n}.npz")
                            for name in ("loop", "engine"))
  print(f"[{federation.name} n={n}] max size {row['max_size']}, raw "
        f"{row['raw_data_bytes'] / 2**30:.2f} GiB, padded "
        f"{row['padded_data_bytes'] / 2**30:.2f} GiB; load {os.getloadavg()[0]:.2f}",
        flush=True)
  engine = child("engine", federation, n, seed, rounds, engine_body, group, precision)
  print(f"[{federation.name} n={n}] engine: {engine}", flush=True)
  loop = child("loop", federation, n, seed, rounds, loop_body, group, precision)
  print(f"[{federation.name} n={n}] loop: {loop}", flush=True)
  row.update({k: engine.get(k) for k in ("seconds_per_round", "peak_rss_bytes")})
  if "error" in engine:
    row["error"] = engine["error"]
  row.update({f"engine_{k}": engine.get(k) for k in ("compile_seconds", "size_classes")})
  row.update({f"loop_{k}": loop.get(k) for k in (
      "seconds_per_round", "peak_rss_bytes", "compile_seconds", "steps_per_round", "compiles",
      "padded_sizes", "error")})
  row["loop_relative_error"] = row["loop_update_relative_error"] = None
  if engine.get("seconds_per_round") is not None and loop.get("seconds_per_round") is not None:
    row["loop_relative_error"], row["loop_update_relative_error"] = body_errors(
        loop_body, engine_body)
  row["load1"] = os.getloadavg()[0]
  return row


def gib(b):
  """Bytes as GiB text ('-' for None)."""
  return "-" if b is None else f"{b / 2**30:.2f}"


def ratio(a, b):
  """a / b as text ('-' where either is None)."""
  return "-" if a is None or b is None else f"{a / b:.2f}"


def format_table(rows):
  """The rows as a fixed-width text table."""
  header = (f"{'data':>9} {'n':>6} {'cohort':>6} {'max m':>7} {'mean m':>7} "
            f"{'engine s':>9} {'loop s':>7} {'engine/loop':>11} {'engine RSS':>10} "
            f"{'loop RSS':>8} {'raw GiB':>7} {'RSS/raw':>7} {'padded/raw':>10} "
            f"{'rel err':>8}")
  lines = [header, "-" * len(header)]
  for r in rows:
    engine, loop = r["seconds_per_round"], r["loop_seconds_per_round"]
    error = r["loop_relative_error"]
    lines.append(
        f"{r['data']:>9} {r['n']:>6} {r['cohort']:>6} {r['max_size']:>7} "
        f"{r['mean_size']:>7.0f} {'-' if engine is None else f'{engine:.3f}':>9} "
        f"{'-' if loop is None else f'{loop:.3f}':>7} {ratio(engine, loop):>11} "
        f"{gib(r['peak_rss_bytes']):>10} {gib(r['loop_peak_rss_bytes']):>8} "
        f"{gib(r['raw_data_bytes']):>7} {ratio(r['peak_rss_bytes'], r['raw_data_bytes']):>7} "
        f"{r['padded_data_bytes'] / r['raw_data_bytes']:>10.1f} "
        f"{'-' if error is None else f'{error:.0e}':>8}")
  for r in rows:
    for what in ("error", "loop_error"):
      if r.get(what):
        lines.append(f"{r['data']} n={r['n']}: {what}: {r[what]}")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--clients", type=int, nargs="+",
                      help="n values of Synthetic (default 1000 20000)")
  parser.add_argument("--data", nargs="+", choices=tuple(FEDERATIONS),
                      default=list(FEDERATIONS), help="the federations (default: all three)")
  parser.add_argument("--rounds", type=int, help="timed rounds after the warm-up (default 3; "
                      "quick 2)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--client-group", type=int, default=10,
                      help="clients the engine trains together in one vmap (default 10)")
  parser.add_argument("--precision", choices=tuple(PRECISIONS), default="float32",
                      help="the model's precision (make_model's; default float32: float32 "
                           "matmuls and convs on every backend; tf32: jax's default)")
  parser.add_argument("--quick", action="store_true",
                      help="smoke test: Synthetic n = 100 and 200, 200 FEMNIST writers, "
                           "1,000 Sent140 users")
  parser.add_argument("--json", metavar="PATH", help="also write the rows as a JSON list")
  parser.add_argument("--child", choices=("engine", "loop"), help=argparse.SUPPRESS)
  parser.add_argument("--body", help=argparse.SUPPRESS)
  args = parser.parse_args()
  rounds = args.rounds if args.rounds is not None else (2 if args.quick else 3)
  if rounds < 1:
    parser.error(f"--rounds must be >= 1, got {rounds}")
  if args.child:
    run = run_engine if args.child == "engine" else run_loop
    federation = FEDERATIONS[args.data[0]]
    print(json.dumps(run(federation, args.clients[0], args.seed, rounds, args.body,
                         args.client_group, args.precision)))
    return
  runs = []
  for name in args.data:
    federation = FEDERATIONS[name]
    if args.quick:
      sizes = federation.quick_clients
    elif federation.clients is None:
      sizes = args.clients or [1000, 20000]
    else:
      sizes = [federation.clients]
    runs += [(federation, n) for n in sizes]
  print("\n".join(machine_info()))
  print(f"started {now()}")
  print(f"FedRep at participation {PARTICIPATION}, {HEAD_EPOCHS} head + {LOCAL_EPOCHS} body "
        f"epochs, batch {BATCH}, lr {LR}, precision {args.precision}; 1 warm-up + {rounds} "
        f"timed rounds", flush=True)
  with tempfile.TemporaryDirectory() as workdir:
    rows = [measure(federation, n, args.seed, rounds, workdir, args.client_group,
                    args.precision) for federation, n in runs]
  report(rows, format_table(rows), args.json)


if __name__ == "__main__":
  main()
