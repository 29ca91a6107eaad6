"""Time per neural FedAvg round: clients vmapped in groups (this engine) vs a per-client loop.

One round of C clients (all participate), each training the global model locally for
`epochs` epochs of minibatch SGD (batch 10, lr 0.01, momentum 0.5, weight decay 1e-4) on
its own synthetic data, then the server's count-weighted average, for two models:
  cnn  FedRep's CIFAR-10 CNN (`make_model('cifar10-cnn')`) on 32x32x3 inputs;
  mlp  the MLP 784->512->256->64->10 (`make_model('mlp', 10)`) on 28x28x1 inputs.

Two implementations of the same round, timed in the same process after compilation:
  vmap  the package: `jax.jit(alg.round)` of `make_algorithm('fedavg', ...)` with the cohort
        vmapped in client groups of g (`client_group=g`; the groups run one after another);
  loop  as fedjax / PFLlib run clients: a Python loop over clients, each one call of a jitted
        per-client function (`train.sgd_epochs` on one client's data, params and key,
        compiled once), then the count-weighted average of the results.
Before timing, both run one short round (4 clients of at most 20 samples with different
counts, same per-client keys fold_in(key_clients, client), full float32 matmul precision)
and their averaged params must agree.

  python benchmarks/nn_round.py                 # 100 clients x 500 samples, both models
  python benchmarks/nn_round.py --quick         # 10 clients x 100 samples: a smoke test
  python benchmarks/nn_round.py --models mlp --groups 1 10 100 --json mlp.json
"""

import argparse
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.data.federated import ClientDatasets
from linear_round import machine_info, now, write_json  # benchmarks/ is the script's directory
from fedjax_rep.nn import train
from fedjax_rep.nn.hparams import hparams as nn_hparams
from fedjax_rep.nn.models import make_model
from fedjax_rep.nn.algorithms import make_algorithm

BATCH, LR, MOMENTUM, WEIGHT_DECAY = 10, 0.01, 0.5, 1e-4
NUM_CLASSES = 10
# name -> (registered model, input shape, default client groups, default timed calls)
MODELS = {
    "cnn": ("cifar10-cnn", (32, 32, 3), (1, 5, 10), 2),
    "mlp": ("mlp", (28, 28, 1), (1, 5, 20), 5),
}
QUICK_GROUPS = (2, 5)
# The check: a short round (CHECK_SAMPLES samples, two batches) in full float32 matmul
# precision. A round of many steps is no check off the CPU: ReLU and max-pool gradients
# switch at ties, so TF32's rounding (jax's default on NVIDIA GPUs) or another kernel's
# summation order grows over 50 steps into a different update (measured on an H100, 500
# samples: loop vs vmap 0.4-0.8 of the update in TF32, 1e-4 to 1e-2 in full precision).
CHECK_CLIENTS, CHECK_GROUP, CHECK_SAMPLES = 4, 2, 2 * BATCH
TOLERANCE = 1e-5  # relative error of the averaged params, loop vs vmap
UPDATE_TOLERANCE = 1e-3  # relative error of the round's update (new - old params)


# --- data and FLOPs --------------------------------------------------------------------------


def synthetic_data(key, num_clients, samples, input_shape, counts=None) -> ClientDatasets:
  """Standard normal inputs [n, samples, *input_shape] and uniform labels; counts [n] real
  samples per client (default: all). The test set (unused by a round) is one row."""
  key_x, key_y = jax.random.split(key)
  x = jax.random.normal(key_x, (num_clients, samples, *input_shape))
  y = jax.random.randint(key_y, (num_clients, samples), 0, NUM_CLASSES)
  counts = jnp.full(num_clients, samples, jnp.int32) if counts is None else jnp.asarray(
      counts, jnp.int32)
  real = jnp.arange(samples)[None, :] < counts[:, None]  # zero padding past the real rows
  x = jnp.where(real.reshape(*real.shape, *[1] * len(input_shape)), x, 0.0)
  return ClientDatasets(x=x, y=jnp.where(real, y, 0), counts=counts, x_test=x[:, :1],
                        y_test=y[:, :1], test_counts=jnp.ones(num_clients, jnp.int32),
                        num_classes=NUM_CLASSES)


def forward_flops(model, input_shape) -> int:
  """Multiply-add FLOPs (2 per multiply-add) of one example's forward pass through the
  convolutions and dense layers of a `models.Classifier` (bias, ReLU, pooling, softmax
  not counted). A VALID k x k conv to cout channels costs 2 H' W' k^2 cin cout."""
  h, w, c = input_shape
  k, macs = model.body.kernel_size, 0
  for cout in model.body.convs:
    h, w = h - k + 1, w - k + 1
    macs += h * w * k * k * c * cout
    h, w, c = h // 2, w // 2, cout  # 2x2 max pool
  features = h * w * c
  for out in (*model.body.fcs, model.num_classes):
    macs += features * out
    features = out
  return 2 * macs


# --- the two implementations ---------------------------------------------------------------


class VmapRound:
  """This engine's round: `jax.jit(alg.round)` of FedAvg over all clients of `data` in client
  groups of `group` (or of the algorithm `alg`, when given), compiled ahead of time; initial
  params from `key_init`, round key `key`. Calling it returns the averaged params."""

  def __init__(self, model, data, hparams, key_init, key, group, alg=None):
    self.alg = alg if alg is not None else make_algorithm(
        "fedavg", model=model, cohort=data.num_clients, local_epochs=1, batch_size=BATCH,
        client_group=group)
    state = jax.block_until_ready(self.alg.init(key_init, data, hparams))
    self.args = (state, key, data, hparams)
    start = time.perf_counter()
    self.compiled = jax.jit(self.alg.round).lower(*self.args).compile()
    self.compile_s = time.perf_counter() - start

  @property
  def initial(self) -> dict:
    """The global params before the round (flat dict)."""
    return self.args[0].shared

  def __call__(self) -> dict:
    return jax.block_until_ready(self.compiled(*self.args)[0].shared)


class LoopRound:
  """The per-client loop: one compiled call of `train.sgd_epochs` per client, on that
  client's own arrays, then sum_i count_i params_i / sum_i count_i. Client i trains with
  key fold_in(key_clients, i), key_clients = split(key)[1], as `Personalized.round` does
  at full participation. Calling it returns the averaged params."""

  def __init__(self, alg, initial, data, hparams, key):
    self.initial, self.hparams = initial, hparams
    self.key_clients = jax.random.split(key)[1]
    self.clients = [(data.x[i], data.y[i], data.counts[i]) for i in range(data.num_clients)]
    self.weights = [np.float32(c) for c in np.asarray(data.counts)]

    def local(shared, x, y, count, key_clients, client, hparams):
      key = jax.random.fold_in(key_clients, client)
      params, _ = train.sgd_epochs(alg.loss, shared, x, y, count, key, hparams,
                                   epochs=alg.local_epochs, batch_size=alg.batch_size)
      return params

    def accumulate(sums, params, weight):
      return jax.tree.map(lambda s, p: s + weight * p, sums, params)

    start = time.perf_counter()
    self.local = jax.jit(local).lower(initial, *self.clients[0], self.key_clients,
                                      np.int32(0), hparams).compile()
    self.accumulate = jax.jit(accumulate, donate_argnums=0).lower(
        initial, initial, self.weights[0]).compile()
    self.compile_s = time.perf_counter() - start

  def __call__(self) -> dict:
    sums = jax.tree.map(jnp.zeros_like, self.initial)
    for i, ((x, y, count), weight) in enumerate(zip(self.clients, self.weights)):
      params = self.local(self.initial, x, y, count, self.key_clients, np.int32(i),
                          self.hparams)
      sums = self.accumulate(sums, params, weight)
    total = np.float32(sum(self.weights))
    return jax.block_until_ready(jax.tree.map(lambda s: s / total, sums))


def relative_errors(params, reference, initial):
  """Largest (over parameter arrays) relative error of `params` vs `reference`, and of the
  update params - initial vs reference - initial."""
  error, update_error = 0.0, 0.0
  for name in reference:
    p, r, p0 = (np.asarray(t[name], np.float64) for t in (params, reference, initial))
    error = max(error, np.linalg.norm(p - r) / np.linalg.norm(r))
    update_error = max(update_error, np.linalg.norm(p - r) / np.linalg.norm(r - p0))
  return error, update_error


def check(model, input_shape, hparams):
  """Asserts that one round of the vmap engine (groups of CHECK_GROUP) and of the loop give
  the same averaged params for CHECK_CLIENTS clients of at most CHECK_SAMPLES samples (their
  counts differ), both compiled with full float32 matmul precision; returns the relative
  errors of the params and of the update."""
  samples = CHECK_SAMPLES
  counts = [samples - i * samples // 2 // CHECK_CLIENTS for i in range(CHECK_CLIENTS)]
  data = synthetic_data(jax.random.key(10), CHECK_CLIENTS, samples, input_shape, counts)
  key_init, key = jax.random.key(11), jax.random.key(12)
  with jax.default_matmul_precision("highest"):  # the programs compile inside
    vmap = VmapRound(model, data, hparams, key_init, key, CHECK_GROUP)
    loop = LoopRound(vmap.alg, vmap.initial, data, hparams, key)
  error, update_error = relative_errors(loop(), vmap(), vmap.initial)
  assert error < TOLERANCE and update_error < UPDATE_TOLERANCE, (
      f"loop and vmap disagree after one round: relative error of the params {error:.1e}, "
      f"of the update {update_error:.1e}")
  return error, update_error


# --- timing --------------------------------------------------------------------------------


def interleaved_seconds(impls, calls):
  """For each of `impls`: (wall seconds, process CPU seconds) of its fastest (by wall time)
  call, and the wall times of all its calls. The calls go round-robin (each implementation
  once, then again, `calls` times), so a drift in the machine's speed hits all alike."""
  times = [[] for _ in impls]
  for _ in range(calls):
    for impl_times, impl in zip(times, impls):
      start, start_cpu = time.perf_counter(), time.process_time()
      impl()
      impl_times.append((time.perf_counter() - start, time.process_time() - start_cpu))
  return [(*min(t), [wall for wall, _ in t]) for t in times]


def matmul_gflops(repeats=5, size=2048):
  """float32 matmul rate (GFLOP/s) of a jitted [size, size] @ [size, size], best of several
  batches of calls lasting >= 0.2 s each."""
  a = jax.random.normal(jax.random.key(0), (size, size))
  matmul = jax.jit(lambda a, b: a @ b)
  matmul(a, a).block_until_ready()
  calls, best = 1, math.inf
  for _ in range(repeats):
    while True:
      start = time.perf_counter()
      for _ in range(calls):
        matmul(a, a).block_until_ready()
      elapsed = time.perf_counter() - start
      if elapsed >= 0.2:
        break
      calls = math.ceil(calls * 1.2 * 0.2 / max(elapsed, 1e-6))
    best = min(best, elapsed / calls)
  return 2 * size**3 / best / 1e9


def load():
  """The 1-minute load average."""
  return os.getloadavg()[0]


def row(name, implementation, group, impl, timing, examples, flops_per_example, matmul):
  """The table row of `impl` from its `interleaved_seconds` timing."""
  seconds, cpu_seconds, times = timing
  gflops = examples * flops_per_example / seconds / 1e9
  return {"model": name, "implementation": implementation, "group": group,
          "clients": len(impl.clients) if implementation == "loop" else impl.alg.cohort,
          "compile_seconds": impl.compile_s, "seconds_per_round": seconds,
          "seconds_all": times, "cpu_seconds_per_round": cpu_seconds,
          "examples_per_second": examples / seconds, "gflops": gflops,
          "fraction_of_matmul": gflops / matmul, "load1": load()}


def benchmark_model(name, clients, samples, groups, calls, hparams, matmul):
  """Check, then the loop row and one vmap row per group size of model `name`."""
  registered, input_shape, _, _ = MODELS[name]
  model = make_model(registered, NUM_CLASSES)
  train_flops = 3 * forward_flops(model, input_shape)
  examples = clients * samples  # one epoch
  print(f"\n[{name}] {registered}: {input_shape} inputs; forward "
        f"{forward_flops(model, input_shape) / 1e6:.2f} MFLOP/example, training (x3) "
        f"{train_flops / 1e6:.2f} MFLOP/example, {examples * train_flops / 1e12:.3f} "
        f"TFLOP/round; load {load():.2f}", flush=True)
  error, update_error = check(model, input_shape, hparams)
  print(f"[{name}] check ({CHECK_CLIENTS} clients, {CHECK_SAMPLES} samples, groups of "
        f"{CHECK_GROUP}, 1 round in full precision, loop vs "
        f"vmap): relative error of the params {error:.1e}, of the update {update_error:.1e}",
        flush=True)
  data = synthetic_data(jax.random.key(0), clients, samples, input_shape)
  key_init, key = jax.random.key(1), jax.random.key(2)
  impls = [VmapRound(model, data, hparams, key_init, key, group) for group in groups]
  loop = LoopRound(impls[0].alg, impls[0].initial, data, hparams, key)  # same initial params
  impls.insert(0, loop)
  labels = [("loop", None)] + [("vmap", group) for group in groups]
  for (implementation, group), impl in zip(labels, impls):
    print(f"[{name}] {implementation} {group or ''}: compile {impl.compile_s:.1f} s", flush=True)
  rows = [row(name, implementation, group, impl, timing, examples, train_flops, matmul)
          for (implementation, group), impl, timing in zip(labels, impls,
                                                            interleaved_seconds(impls, calls))]
  best = min((r for r in rows if r["implementation"] == "vmap"),
             key=lambda r: r["seconds_per_round"])
  for r in rows:
    r["best"] = r is best
    r.update(samples=samples, epochs=1, batch_size=BATCH, flops_per_example=train_flops,
             matmul_gflops=matmul)
  return rows


# --- output --------------------------------------------------------------------------------


def format_table(rows):
  """The results as a fixed-width text table; '*' marks each model's fastest group."""
  header = (f"{'model':>5} {'impl':>5} {'group':>6} {'clients':>7} {'compile s':>9} "
            f"{'s/round':>8} {'cpu s':>7} {'examples/s':>10} {'GFLOP/s':>8} {'of matmul':>9} "
            f"{'x loop':>6} {'x cpu':>6} {'load':>5}")
  lines = [header, "-" * len(header)]
  for r in rows:
    loop = next(q for q in rows if q["model"] == r["model"] and q["implementation"] == "loop")
    group = "-" if r["group"] is None else f"{r['group']}" + ("*" if r["best"] else "")
    lines.append(
        f"{r['model']:>5} {r['implementation']:>5} {group:>6} {r['clients']:>7} "
        f"{r['compile_seconds']:>9.1f} {r['seconds_per_round']:>8.2f} "
        f"{r['cpu_seconds_per_round']:>7.2f} "
        f"{r['examples_per_second']:>10.0f} {r['gflops']:>8.1f} "
        f"{r['fraction_of_matmul']:>9.1%} "
        f"{loop['seconds_per_round'] / r['seconds_per_round']:>6.2f} "
        f"{loop['cpu_seconds_per_round'] / r['cpu_seconds_per_round']:>6.2f} {r['load1']:>5.2f}")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
  parser.add_argument("--clients", type=int, help="clients per round (default 100; 10 quick)")
  parser.add_argument("--samples", type=int,
                      help="training samples per client (default 500; 100 quick)")
  parser.add_argument("--groups", type=int, nargs="+",
                      help="client group sizes of the vmap engine, for every model (default: "
                      + "; ".join(f"{m} {' '.join(map(str, v[2]))}" for m, v in MODELS.items())
                      + ")")
  parser.add_argument("--calls", type=int,
                      help="timed calls per implementation, best taken (default: cnn "
                      f"{MODELS['cnn'][3]}, mlp {MODELS['mlp'][3]}; quick 1)")
  parser.add_argument("--quick", action="store_true",
                      help=f"smoke test: 10 clients x 100 samples, groups {QUICK_GROUPS}")
  parser.add_argument("--json", metavar="PATH", help="also write the rows as a JSON list")
  args = parser.parse_args()
  clients = args.clients or (10 if args.quick else 100)
  samples = args.samples or (100 if args.quick else 500)

  print("\n".join(machine_info()))
  print(f"started {now()}")
  print(f"FedAvg round: {clients} clients (all participate) x {samples} samples, 1 local "
        f"epoch, batch {BATCH}, lr {LR}, momentum {MOMENTUM}, weight decay {WEIGHT_DECAY}, "
        f"float32")
  matmul = matmul_gflops()
  print(f"matmul: {matmul:.0f} GFLOP/s (jax, float32 2048^3, best of 5)")
  hparams = nn_hparams(LR, MOMENTUM, WEIGHT_DECAY)
  rows = []
  for name in args.models:
    groups = args.groups or (QUICK_GROUPS if args.quick else MODELS[name][2])
    skipped = [g for g in groups if g > clients]
    if skipped:
      print(f"[{name}] skipping groups larger than the cohort: {skipped}")
    calls = args.calls or (1 if args.quick else MODELS[name][3])
    rows += benchmark_model(name, clients, samples, [g for g in groups if g <= clients],
                            calls, hparams, matmul)
  print(f"\nfinished {now()}\n")
  print(format_table(rows))
  print("* the fastest group size of the model's vmap rows")
  for name in args.models:
    loop = next(r for r in rows if r["model"] == name and r["implementation"] == "loop")
    best = next(r for r in rows if r["model"] == name and r["best"])
    print(f"{name}: vmap (group {best['group']}) vs loop: {best['seconds_per_round']:.2f} s vs "
          f"{loop['seconds_per_round']:.2f} s per round, vmap is "
          f"{loop['seconds_per_round'] / best['seconds_per_round']:.2f}x the loop's speed "
          f"({loop['cpu_seconds_per_round'] / best['cpu_seconds_per_round']:.2f}x in CPU "
          f"seconds: {best['cpu_seconds_per_round']:.2f} vs {loop['cpu_seconds_per_round']:.2f})")
  if args.json:
    write_json(args.json, rows)


if __name__ == "__main__":
  main()
