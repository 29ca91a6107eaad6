"""Seconds per round and peak memory of neural FedRep on clients of natural, heavy-tailed sizes.

n clients of LEAF/FedProx Synthetic(1, 1) (`data.synthetic`) with UNCAPPED sizes
int(LogNormal(4, 2)) + 50 (80/20 train/test split, as table1-synthetic), participation 0.01,
and table1-synthetic's FedRep round (`synthetic-mlp`, 10 head epochs then 1 body epoch,
batch 10, lr 0.05, momentum 0.5, weight decay 1e-4, client groups of 10), against two
baselines measured in the same run on the same cohorts:
  raw     the size of the data in memory: sum over clients of (train + test rows) x
          (features x 4 + 4) bytes;
  loop    as PFLlib / FL-bench run clients: a Python loop over the cohort, each client one
          call of a jitted client function on its own data (zero-padded to the next power of
          two, so one compile per power of two) that runs exactly its own 11 ceil(m_i / 10)
          SGD steps (`lax.fori_loop` with a dynamic trip count; no padded step runs), then
          the count-weighted average of the bodies. Its compiles are counted.
  engine  today's engine: `jax.jit(alg.round)` of the registered `fedrep` on ClientDatasets
          padded to the largest client (every cohort client runs the largest client's
          steps, masked). Skipped, with its estimate, where the padded arrays would exceed
          --memory-limit-gb (issue 49 replaces this layout).
Each (n, implementation) runs in a fresh subprocess (peak RSS is a process-lifetime peak):
the same round keys, hence the same cohorts (`core.cohort.sample_cohort`) and client keys,
one untimed warm-up round after compiling, then --rounds timed rounds (their mean). Where
both ran, the final bodies are compared (relative error of the params and of their update).

  python benchmarks/nn_scale.py --clients 1000 20000 --json /tmp/nn_scale.json
  python benchmarks/nn_scale.py --quick            # n = 100 and 200, 2 rounds: a smoke test
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

import jax
import jax.numpy as jnp
import numpy as np

from linear_round import machine_info, now, write_json  # benchmarks/ is the script's directory
from fedjax_rep.core.cohort import cohort_size, sample_cohort
from fedjax_rep.data import synthetic
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.hparams import hparams as nn_hparams
from fedjax_rep.nn.models import make_model
from fedjax_rep.nn.registry import make_algorithm

ALPHA, BETA, DIM, CLASSES = 1.0, 1.0, 60, 10
TEST_FRACTION = 0.2  # table1-synthetic's
PARTICIPATION = 0.01
HEAD_EPOCHS, LOCAL_EPOCHS, BATCH, GROUP = 10, 1, 10, 10
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.5, 1e-4
ROW_BYTES = DIM * 4 + 4  # one sample: float32 features and an int32 label
MIN_PAD = 64  # the loop pads a client to max(64, next power of two)


# --- sizes and memory estimates ------------------------------------------------------------


def client_sizes(n, seed):
  """(train rows [n], test rows [n]) of Synthetic's n clients, drawn as `synthetic.generate`
  draws them (its first draw) and split as `synthetic.federated` splits them."""
  rng = np.random.default_rng(seed)
  sizes = rng.lognormal(synthetic.SIZE_MEAN, synthetic.SIZE_SIGMA, n).astype(np.int64)
  sizes += synthetic.SIZE_MIN
  train_rows = np.clip((sizes * (1 - TEST_FRACTION)).astype(np.int64), 1, sizes - 1)
  return train_rows, sizes - train_rows


def memory_estimates(n, seed):
  """{raw_data_bytes, padded_data_bytes, max_size, mean_size} of n clients: the raw bytes
  sum_i (train_i + test_i) x ROW_BYTES, the padded layout's n (max train + max test) x
  ROW_BYTES."""
  train_rows, test_rows = client_sizes(n, seed)
  sizes = train_rows + test_rows
  return {"raw_data_bytes": int(sizes.sum()) * ROW_BYTES,
          "padded_data_bytes": n * int(train_rows.max() + test_rows.max()) * ROW_BYTES,
          "max_size": int(sizes.max()), "mean_size": float(sizes.mean())}


def round_keys(seed, rounds):
  """The keys of the warm-up round and the `rounds` timed ones."""
  return list(jax.random.split(jax.random.key(seed + 1), rounds + 1))


def cohorts(keys, n):
  """The cohort [c] (numpy) of each round key, as `Personalized.round` draws it."""
  size = cohort_size(n, PARTICIPATION)
  return [np.asarray(sample_cohort(jax.random.split(k)[0], n, size)) for k in keys]


def algorithm(n):
  """table1-synthetic's FedRep for n clients at participation PARTICIPATION, and hparams."""
  model = make_model("synthetic-mlp", CLASSES)
  alg = make_algorithm("fedrep", model=model, cohort=cohort_size(n, PARTICIPATION),
                       local_epochs=LOCAL_EPOCHS, head_epochs=HEAD_EPOCHS, batch_size=BATCH,
                       client_group=GROUP)
  return alg, nn_hparams(LR, MOMENTUM, WEIGHT_DECAY)


def peak_rss_bytes():
  """This process's peak resident set size so far (bytes)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --- the engine (a child process) ----------------------------------------------------------


def run_engine(n, seed, rounds, body_path):
  """Today's engine on n padded clients: compile, one warm-up round, `rounds` timed rounds;
  saves the final body to body_path; returns the child's result."""
  data = synthetic.federated(ALPHA, BETA, n, seed, dim=DIM, num_classes=CLASSES,
                             test_fraction=TEST_FRACTION)
  alg, hparams = algorithm(n)
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
  steps = alg.cohort * (HEAD_EPOCHS + LOCAL_EPOCHS) * math.ceil(data.x.shape[1] / BATCH)
  return {"seconds_per_round": float(np.mean(times[1:])), "seconds_all": times[1:],
          "compile_seconds": compile_s, "peak_rss_bytes": peak_rss_bytes(),
          "steps_per_round": steps, "compiles": 1}


# --- the per-client loop (a child process) -------------------------------------------------


TRACES = [0]  # times the loop's client function was traced (= compiled)


def sgd_exact(loss_fn, params, x, y, count, key, hparams, *, epochs, batch_size):
  """`train.sgd_epochs` (same shuffles, keys and masking) on x [P, ...] with `count` real
  rows, running only the ceil(count / batch_size) real steps of each epoch (a dynamic
  `fori_loop` trip count): params after `epochs` epochs."""
  size = x.shape[0]
  steps = (count + batch_size - 1) // batch_size
  tx = train.optimizer(hparams)
  grad_fn = jax.value_and_grad(loss_fn)
  epoch_keys = jax.random.split(key, epochs)

  def epoch(e, carry):
    key_order, key_steps = jax.random.split(epoch_keys[e])
    order = jnp.pad(train.epoch_order(key_order, count, size), (0, batch_size))
    step_keys = jax.random.split(key_steps, math.ceil(size / batch_size))

    def step(s, carry):
      params, opt_state = carry
      start = s * batch_size
      rows = jax.lax.dynamic_slice_in_dim(order, start, batch_size)
      weights = ((start + jnp.arange(batch_size)) < count).astype(jnp.float32)
      _, params, opt_state = train.sgd_step(grad_fn, tx, params, opt_state, x[rows], y[rows],
                                            weights, step_keys[s])
      return params, opt_state

    return jax.lax.fori_loop(0, steps, step, carry)

  return jax.lax.fori_loop(0, epochs, epoch, (params, tx.init(params)))[0]


def loop_client(alg):
  """client(body, head, x [P, d], y [P], count, key, hparams) -> (body, head): FedRep's
  client update (`PartialSharing.client_update`): the head's epochs on the frozen body's
  features, then the body's with the new head frozen, each by `sgd_exact`."""

  def client(body, head, x, y, count, key, hparams):
    TRACES[0] += 1
    key_head, key_body = jax.random.split(key)
    h = alg.features(body, x)

    def head_loss(p, hb, yb, wb, k):
      return train.cross_entropy(alg.head_logits(p, hb, k), yb, wb)

    head = sgd_exact(head_loss, head, h, y, count, key_head, hparams, epochs=HEAD_EPOCHS,
                     batch_size=BATCH)

    def body_loss(p, xb, yb, wb, k):
      return alg.loss(params_lib.merge(p, head), xb, yb, wb, k)

    body = sgd_exact(body_loss, body, x, y, count, key_body, hparams, epochs=LOCAL_EPOCHS,
                     batch_size=BATCH)
    return body, head

  return client


def padded_rows(a, rows):
  """a [m, ...] zero-padded to `rows` rows."""
  out = np.zeros((rows, *a.shape[1:]), a.dtype)
  out[:len(a)] = a
  return out


def pad_size(count):
  """The loop's padded size of a client of `count` rows: max(MIN_PAD, next power of two)."""
  return max(MIN_PAD, 1 << int(count - 1).bit_length())


def run_loop(n, seed, rounds, body_path):
  """The per-client loop on n unpadded clients (all held in memory, as generated): the
  client function compiled for each padded size the cohorts need, one warm-up round,
  `rounds` timed rounds; saves the final body; returns the child's result."""
  data = synthetic.generate(ALPHA, BETA, n, seed, dim=DIM, num_classes=CLASSES)
  train_rows, _ = client_sizes(n, seed)
  assert [len(y) for y in data["y"][:10]] == list(
      (train_rows + client_sizes(n, seed)[1])[:10]), "sizes drawn unlike synthetic.generate"
  xs, ys = data["x"], data["y"]  # client i trains on its first train_rows[i] rows
  alg, hparams = algorithm(n)
  fake = type("Shape", (), {"x": np.zeros((1, 1, DIM), np.float32), "num_clients": n})
  state = alg.init(jax.random.key(seed + 2), fake, hparams)
  body, head0 = state.shared, jax.tree.map(lambda p: p[0], state.personal)
  initial, heads = body, {}
  keys = round_keys(seed, rounds)
  round_cohorts = cohorts(keys, n)
  client = loop_client(alg)

  def accumulate(sums, params, weight):
    return jax.tree.map(lambda s, p: s + weight * p, sums, params)

  start = time.perf_counter()
  compiled = {}
  for size in sorted({pad_size(train_rows[i]) for c in round_cohorts for i in c}):
    compiled[size] = jax.jit(client).lower(
        body, head0, np.zeros((size, DIM), np.float32), np.zeros(size, np.int32),
        np.int32(1), keys[0], hparams).compile()
  add = jax.jit(accumulate).lower(body, body, np.float32(1)).compile()
  compile_s = time.perf_counter() - start
  times = []
  for key, cohort in zip(keys, round_cohorts):
    start = time.perf_counter()
    key_clients = jax.random.split(key)[1]
    sums, total = jax.tree.map(jnp.zeros_like, body), 0.0
    for i in cohort:
      count = int(train_rows[i])
      size = pad_size(count)
      new_body, heads[i] = compiled[size](
          body, heads.get(i, head0), padded_rows(xs[i][:count], size),
          padded_rows(ys[i][:count], size), np.int32(count),
          jax.random.fold_in(key_clients, i), hparams)
      sums = add(sums, new_body, np.float32(count))
      total += count
    body = jax.block_until_ready(jax.tree.map(lambda s: s / np.float32(total), sums))
    times.append(time.perf_counter() - start)
  save_body(body_path, initial, body)
  steps = sum((HEAD_EPOCHS + LOCAL_EPOCHS) * math.ceil(train_rows[i] / BATCH)
              for c in round_cohorts[1:] for i in c) / rounds
  return {"seconds_per_round": float(np.mean(times[1:])), "seconds_all": times[1:],
          "compile_seconds": compile_s, "peak_rss_bytes": peak_rss_bytes(),
          "steps_per_round": steps, "compiles": TRACES[0],
          "padded_sizes": sorted(compiled)}


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


def child(implementation, n, seed, rounds, body_path):
  """Runs one measurement in a fresh process; its result (a dict), or {'error': text}."""
  run = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", implementation,
                        "--clients", str(n), "--seed", str(seed), "--rounds", str(rounds),
                        "--body", body_path], capture_output=True, text=True)
  if run.returncode != 0:
    return {"error": f"exit {run.returncode}: {run.stderr.strip()[-2000:]}"}
  return json.loads(run.stdout.strip().splitlines()[-1])


def measure(n, seed, rounds, limit_bytes, workdir):
  """The row of n clients: sizes, memory estimates, the engine (or why it was skipped) and
  the loop, and the loop's error against the engine where both ran."""
  row = {"n": n, "cohort": cohort_size(n, PARTICIPATION), "rounds": rounds,
         **memory_estimates(n, seed)}
  loop_body, engine_body = (os.path.join(workdir, f"{name}-{n}.npz") for name in
                            ("loop", "engine"))
  print(f"[n={n}] max size {row['max_size']}, raw {row['raw_data_bytes'] / 2**30:.2f} GiB, "
        f"padded {row['padded_data_bytes'] / 2**30:.2f} GiB; load {os.getloadavg()[0]:.2f}",
        flush=True)
  if row["padded_data_bytes"] > limit_bytes:
    engine = {"seconds_per_round": None, "peak_rss_bytes": None,
              "skipped": f"padded layout needs {row['padded_data_bytes'] / 2**30:.1f} GiB "
                         f"> limit {limit_bytes / 2**30:.1f} GiB"}
  else:
    engine = child("engine", n, seed, rounds, engine_body)
  print(f"[n={n}] engine: {engine}", flush=True)
  loop = child("loop", n, seed, rounds, loop_body)
  print(f"[n={n}] loop: {loop}", flush=True)
  row.update({k: engine.get(k) for k in ("seconds_per_round", "peak_rss_bytes")})
  row.update({k: v for k, v in engine.items() if k in ("skipped", "error")})
  row.update({f"engine_{k}": engine.get(k) for k in ("compile_seconds", "steps_per_round")})
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


def seconds(s):
  """Seconds as text ('-' for None)."""
  return "-" if s is None else f"{s:.2f}"


def format_table(rows):
  """The rows as a fixed-width text table."""
  header = (f"{'n':>6} {'cohort':>6} {'max m':>7} {'mean m':>7} {'padded/raw':>10} "
            f"{'engine s':>9} {'loop s':>7} {'engine/loop':>11} {'engine RSS':>10} "
            f"{'loop RSS':>8} {'raw GiB':>7} {'compiles':>8} {'rel err':>8}")
  lines = [header, "-" * len(header)]
  for r in rows:
    engine, loop = r["seconds_per_round"], r["loop_seconds_per_round"]
    ratio = "-" if engine is None or loop is None else f"{engine / loop:.1f}"
    error = r["loop_relative_error"]
    lines.append(
        f"{r['n']:>6} {r['cohort']:>6} {r['max_size']:>7} {r['mean_size']:>7.0f} "
        f"{r['padded_data_bytes'] / r['raw_data_bytes']:>10.1f} {seconds(engine):>9} "
        f"{seconds(loop):>7} {ratio:>11} {gib(r['peak_rss_bytes']):>10} "
        f"{gib(r['loop_peak_rss_bytes']):>8} {gib(r['raw_data_bytes']):>7} "
        f"{r['loop_compiles'] if r['loop_compiles'] is not None else '-':>8} "
        f"{'-' if error is None else f'{error:.0e}':>8}")
  for r in rows:
    if "skipped" in r:
      lines.append(f"n={r['n']}: engine skipped: {r['skipped']}")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--clients", type=int, nargs="+", help="n values (default 1000 20000)")
  parser.add_argument("--rounds", type=int, help="timed rounds after the warm-up (default 3; "
                      "quick 2)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--memory-limit-gb", type=float, default=16.0,
                      help="skip the engine where its padded arrays exceed this (GiB)")
  parser.add_argument("--quick", action="store_true", help="smoke test: n = 100 and 200")
  parser.add_argument("--json", metavar="PATH", help="also write the rows as a JSON list")
  parser.add_argument("--child", choices=("engine", "loop"), help=argparse.SUPPRESS)
  parser.add_argument("--body", help=argparse.SUPPRESS)
  args = parser.parse_args()
  rounds = args.rounds or (2 if args.quick else 3)
  if args.child:
    run = run_engine if args.child == "engine" else run_loop
    print(json.dumps(run(args.clients[0], args.seed, rounds, args.body)))
    return
  clients = args.clients or ([100, 200] if args.quick else [1000, 20000])
  print("\n".join(machine_info()))
  print(f"started {now()}")
  print(f"FedRep on Synthetic({ALPHA:g}, {BETA:g}), uncapped sizes, participation "
        f"{PARTICIPATION}, {HEAD_EPOCHS} head + {LOCAL_EPOCHS} body epochs, batch {BATCH}, "
        f"lr {LR}; 1 warm-up + {rounds} timed rounds", flush=True)
  with tempfile.TemporaryDirectory() as workdir:
    rows = [measure(n, args.seed, rounds, args.memory_limit_gb * 2**30, workdir)
            for n in clients]
  print(f"\nfinished {now()}\n")
  print(format_table(rows))
  if args.json:
    write_json(args.json, rows)


if __name__ == "__main__":
  main()
