"""FedRep's Table-1 CIFAR-10 settings and the vmapped cohort, timed in one call on the device
there is (an accelerator if jax has one, else the CPU).

Parts, in this order, each giving rows of the output:
  matmul  the device's float32 matmul rate (nn_round.matmul_gflops: [8192, 8192] squared on
          an accelerator, [2048, 2048] on the CPU; jax's default matmul precision, as the
          tf32 model runs: TF32 on NVIDIA GPUs that have it), the denominator of every "of
          matmul";
  e2e     FedRep, (n, S) = (100, 2), 100 rounds end to end through `core.loop.run` as the
          Table-1 recipe runs them: participation 0.1 (a cohort of 10), 10 head epochs then 1
          body epoch, batch 10, SGD lr 0.01, momentum 0.5, weight decay 1e-4, every client
          evaluated every 5 rounds. A first call of 5 rounds compiles; the 100 rounds are
          timed after it, and compile = first call - 5 rounds at the steady rate;
  round   FedRep, (n, S) = (1000, 2): one jitted round (`nn_round.VmapRound`), a cohort of
          100 of the 1000 clients;
  cohort  nn_round's FedAvg round of 100 clients x 500 samples on the CIFAR-10 CNN
          (`nn_round.benchmark_model`): the cohort vmapped in client groups of several sizes
          against a per-client loop of jitted calls, on the same device.
The e2e and round parts run once per precision of `--precision` (`make_model`'s: float32, the
default, every matmul and conv at float32 on every backend; tf32, at jax's default matmul
precision, TF32 on NVIDIA GPUs that have it; bf16, mixed precision, bfloat16 computation with
float32 parameters), in that order, each row naming its precision; with float32 and another,
the other's seconds per round over float32's are printed. The cohort part runs in float32.
`--parts` picks the parts after matmul: `fedrep` (e2e and round) and/or `cohort`, e.g. to split
the suite over two calls where one command's time is limited.
The data are mock CIFAR-10 (it measures speed): standard normal 32x32x3 images, each client's
labels drawn from its own S of the 10 classes, 50,000 / n training and 10,000 / n test samples
per client (CIFAR-10's, split evenly). The client group is chosen from the device's free
memory on an accelerator (`client_group`), as `linear.blocks` sizes its blocks; on the CPU it
is the project's default.
Peak memory: the device allocator's peak bytes in use since the process started, where the
device reports it (not the CPU), and the process's peak RSS, after each part.

  python benchmarks/gpu_suite.py                   # the full sizes (an accelerator: <= 8 min)
  python benchmarks/gpu_suite.py --toy --json rows.json   # every part at toy sizes
  python benchmarks/gpu_suite.py --precision float32 tf32 bf16  # FedRep's parts in each
  python benchmarks/gpu_suite.py --parts cohort           # matmul and the cohort part only
"""

import argparse
import inspect
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import loop
from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.data.federated import ClientDatasets
from fedjax_rep.core import memory
from fedjax_rep.nn.hparams import hparams as nn_hparams
from fedjax_rep.nn.models import PRECISIONS, make_model
from fedjax_rep.nn.algorithms import make_algorithm
from linear_round import machine_info, now, write_json  # benchmarks/ is the script's directory
from nn_round import (BATCH, LR, MOMENTUM, NUM_CLASSES, WEIGHT_DECAY, VmapRound,
                      benchmark_model, format_table, forward_flops, interleaved_seconds, load,
                      matmul_gflops, synthetic_data)

MODEL, INPUT_SHAPE = "cifar10-cnn", (32, 32, 3)
PARTICIPATION, HEAD_EPOCHS, BODY_EPOCHS = 0.1, 10, 1  # FedRep's Table-1 schedule
PARTS = ("fedrep", "cohort")  # --parts: fedrep is the e2e and round parts
DEVICE_MATMUL_SIZE = 8192  # the matmul timed on an accelerator (2048, nn_round's, on the CPU)
GROUP_MEMORY_SHARE = 0.5  # of the device's free memory, for one client group's temporaries
CPU_GROUP = inspect.signature(make_algorithm).parameters["client_group"].default
# Sizes of the full suite and of --toy: n clients with S classes each, samples and test
# samples per client (Table 1: CIFAR-10's 50,000 and 10,000 over the n clients).
FULL = {"e2e": dict(clients=100, classes=2, samples=500, test=100, rounds=100, eval_every=5),
        "round": dict(clients=1000, classes=2, samples=50, test=10, calls=3),
        "cohort": dict(clients=100, samples=500, groups=(1, 10, 50, 100), calls=2)}
TOY = {"e2e": dict(clients=20, classes=2, samples=20, test=5, rounds=4, eval_every=2),
       "round": dict(clients=40, classes=2, samples=10, test=2, calls=1),
       "cohort": dict(clients=4, samples=20, groups=(1, 2), calls=1)}  # as nn_round's check


# --- data, FLOPs, client groups, memory ------------------------------------------------------


def cifar_data(seed, num_clients, classes_per_client, samples, test_samples):
  """Mock CIFAR-10 `ClientDatasets` as `nn_round.synthetic_data` lays them out: standard
  normal images x [n, samples, 32, 32, 3] and x_test [n, test_samples, 32, 32, 3], every
  client's train and test labels drawn uniformly from its own `classes_per_client` distinct
  classes of 10. Drawn with numpy: jax.random would compile a generator per shape."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((num_clients, samples + test_samples, *INPUT_SHAPE), np.float32)
  classes = np.argsort(rng.random((num_clients, NUM_CLASSES)), axis=1)[:, :classes_per_client]
  picks = rng.integers(0, classes_per_client, (num_clients, samples + test_samples))
  y = np.take_along_axis(classes, picks, axis=1).astype(np.int32)
  count = lambda c: jnp.full(num_clients, c, jnp.int32)
  return ClientDatasets(x=jnp.asarray(x[:, :samples]), y=jnp.asarray(y[:, :samples]),
                        counts=count(samples), x_test=jnp.asarray(x[:, samples:]),
                        y_test=jnp.asarray(y[:, samples:]), test_counts=count(test_samples),
                        num_classes=NUM_CLASSES)


def fedrep_flops(model):
  """FLOPs (2 per multiply-add, `nn_round.forward_flops`) of one sample's share of a FedRep
  client update: the frozen body's features once (a forward pass), HEAD_EPOCHS of the head on
  them and BODY_EPOCHS of the whole model, a training pass costing 3 forward passes."""
  full = forward_flops(model, INPUT_SHAPE)
  head = 2 * model.body.fcs[-1] * model.num_classes
  return (full - head) + 3 * HEAD_EPOCHS * head + 3 * BODY_EPOCHS * full


def client_bytes(alg, data, hparams) -> int:
  """Bytes of one client's update: XLA's temporaries, arguments and outputs of
  `alg.client_update` compiled for one client of `data` (`ClientDatasets` or their shapes:
  x [m, ...], y [m], count) with its personal params and the shared ones. A vmapped group of g
  clients needs about g times it."""
  state = jax.eval_shape(alg.init, jax.random.key(0), data, hparams)
  one = lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype)
  compiled = jax.jit(alg.client_update).lower(
      state.shared, jax.tree.map(one, state.personal), one(data.x), one(data.y),
      one(data.counts), jax.random.key(0), hparams,
      alg.round_info(state, data.num_clients)).compile()
  stats = compiled.memory_analysis()
  return (stats.temp_size_in_bytes + stats.argument_size_in_bytes
          + stats.output_size_in_bytes)


def accelerator() -> bool:
  """Whether jax's default backend is an accelerator (not the CPU)."""
  return jax.default_backend() != "cpu"


def client_group(alg, data, hparams) -> tuple[int, int | None]:
  """(clients per vmapped group of `alg`'s cohort on `data`, bytes per client). On an
  accelerator: as many as fit GROUP_MEMORY_SHARE of the device's free memory (bytes_limit -
  bytes_in_use, `core.memory.available_bytes`) at `client_bytes` each. On the CPU: the
  project's default CPU_GROUP, bytes None (not estimated). In [1, cohort]."""
  if not accelerator():
    return min(alg.cohort, CPU_GROUP), None
  per_client = client_bytes(alg, data, hparams)
  budget = int(GROUP_MEMORY_SHARE * memory.available_bytes())
  return max(1, min(alg.cohort, budget // per_client)), per_client


def peaks() -> dict:
  """Peak memory so far: peak_device_bytes (the default device's allocator peak in use since
  the process started; None where it does not report one, as on the CPU) and peak_rss_bytes
  (the process's peak resident set)."""
  stats = jax.devices()[0].memory_stats() or {}
  return {"peak_device_bytes": stats.get("peak_bytes_in_use"),
          "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def fedrep(model, cohort, group):
  """FedRep with Table 1's structure: `cohort` clients per round in vmapped groups of
  `group`."""
  return make_algorithm("fedrep", model=model, cohort=cohort, local_epochs=BODY_EPOCHS,
                        head_epochs=HEAD_EPOCHS, batch_size=BATCH, client_group=group)


# --- the parts -------------------------------------------------------------------------------


def throughput(row, examples, flops, matmul):
  """`row` with examples_per_second, gflops and fraction_of_matmul of `examples` and `flops`
  per its seconds_per_round, then the peaks and the load."""
  seconds = row["seconds_per_round"]
  gflops = flops / seconds / 1e9
  return {**row, "examples_per_second": examples / seconds, "gflops": gflops,
          "fraction_of_matmul": gflops / matmul, **peaks(), "load1": load()}


def end_to_end(model, sizes, hparams, matmul):
  """The e2e row: FedRep on the (n, S) of `sizes` for sizes['rounds'] rounds through
  `loop.run`, evaluated every sizes['eval_every'], after a first call of eval_every rounds."""
  n, s, samples, test = (sizes[k] for k in ("clients", "classes", "samples", "test"))
  rounds, eval_every = sizes["rounds"], sizes["eval_every"]
  data = cifar_data(0, n, s, samples, test)
  cohort = cohort_size(n, PARTICIPATION)
  group, per_client = client_group(fedrep(model, cohort, CPU_GROUP), data, hparams)
  alg = fedrep(model, cohort, group)

  def call(num_rounds):
    start = time.perf_counter()
    loop.run(alg, data, hparams, jax.random.key(1), num_rounds, eval_every=eval_every,
             progress=False)
    return time.perf_counter() - start

  first = call(eval_every)
  total = call(rounds)
  row = {"part": "e2e", "clients": n, "classes_per_client": s, "samples": samples,
         "test_samples": test, "cohort": cohort, "group": group,
         "client_bytes": per_client, "rounds": rounds, "eval_every": eval_every,
         "first_call_seconds": first, "compile_seconds": first - eval_every * total / rounds,
         "total_seconds": total, "seconds_per_round": total / rounds}
  return throughput(row, cohort * samples, cohort * samples * fedrep_flops(model), matmul)


def one_round(model, sizes, hparams, matmul):
  """The round row: one jitted FedRep round (`VmapRound`) on the (n, S) of `sizes`, its
  cohort PARTICIPATION n; the best of sizes['calls'] calls."""
  n, s, samples, test = (sizes[k] for k in ("clients", "classes", "samples", "test"))
  data = cifar_data(2, n, s, samples, test)
  cohort = cohort_size(n, PARTICIPATION)
  group, per_client = client_group(fedrep(model, cohort, CPU_GROUP), data, hparams)
  alg = fedrep(model, cohort, group)
  impl = VmapRound(model, data, hparams, jax.random.key(3), jax.random.key(4), group, alg=alg)
  seconds, _, times = interleaved_seconds([impl], sizes["calls"])[0]
  row = {"part": "round", "clients": n, "classes_per_client": s, "samples": samples,
         "cohort": cohort, "group": group, "client_bytes": per_client,
         "compile_seconds": impl.compile_s, "seconds_per_round": seconds,
         "seconds_all": times}
  return throughput(row, cohort * samples, cohort * samples * fedrep_flops(model), matmul)


def cohort_rows(model, sizes, hparams, matmul):
  """The cohort rows: `nn_round.benchmark_model`'s loop row and vmap rows at the groups of
  sizes['groups'] up to the automatic group, and at it (auto True)."""
  clients, samples = sizes["clients"], sizes["samples"]
  data = jax.eval_shape(lambda: synthetic_data(jax.random.key(0), clients, samples, INPUT_SHAPE))
  fedavg = make_algorithm("fedavg", model=model, cohort=clients, local_epochs=1,
                          batch_size=BATCH, client_group=CPU_GROUP)
  auto, per_client = client_group(fedavg, data, hparams)
  groups = sorted({g for g in sizes["groups"] if g <= auto} | {auto})
  rows = benchmark_model("cnn", clients, samples, groups, sizes["calls"], hparams, matmul)
  return [{**r, "part": "cohort", "auto": r["group"] == auto, "client_bytes": per_client,
           **peaks()} for r in rows]


# --- output ----------------------------------------------------------------------------------


def gigabytes(value, scale=1e9):
  """`value` bytes in GB (in MB with scale 1e6), or '-' for None."""
  return "-" if value is None else f"{value / scale:.2f}"


def format_fedrep(rows):
  """The e2e and round rows (with their precision) as a fixed-width text table."""
  header = (f"{'part':>5} {'precision':>9} {'n':>5} {'S':>2} {'cohort':>6} {'group':>5} "
            f"{'client MB':>9} {'rounds':>6} {'compile s':>9} {'total s':>8} {'s/round':>8} "
            f"{'examples/s':>10} "
            f"{'GFLOP/s':>8} {'of matmul':>9} {'dev peak GB':>11} {'RSS GB':>6} {'load':>5}")
  lines = [header, "-" * len(header)]
  for r in rows:
    lines.append(
        f"{r['part']:>5} {r['precision']:>9} {r['clients']:>5} {r['classes_per_client']:>2} "
        f"{r['cohort']:>6} {r['group']:>5} {gigabytes(r['client_bytes'], 1e6):>9} "
        f"{r.get('rounds', 1):>6} "
        f"{r['compile_seconds']:>9.1f} {r.get('total_seconds', r['seconds_per_round']):>8.2f} "
        f"{r['seconds_per_round']:>8.3f} {r['examples_per_second']:>10.0f} "
        f"{r['gflops']:>8.1f} {r['fraction_of_matmul']:>9.1%} "
        f"{gigabytes(r['peak_device_bytes']):>11} {gigabytes(r['peak_rss_bytes']):>6} "
        f"{r['load1']:>5.2f}")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--toy", action="store_true",
                      help="every part at toy sizes (a few clients and samples, 4 rounds)")
  parser.add_argument("--precision", nargs="+", choices=tuple(PRECISIONS), default=["float32"],
                      help="the precisions of the e2e and round parts, run in this order "
                           "(default: float32, float32 matmuls and convs on every backend; "
                           "tf32: jax's default matmul precision)")
  parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                      help="the parts to run after matmul: fedrep (e2e and round, in each "
                           "precision) and/or cohort (default: both)")
  parser.add_argument("--json", metavar="PATH",
                      help="also write the rows and the machine as JSON ({machine, rows})")
  args = parser.parse_args()
  sizes = TOY if args.toy else FULL

  print("\n".join(machine_info()))
  print(f"started {now()}; {'toy' if args.toy else 'full'} sizes on "
        f"{jax.devices()[0].device_kind} ({jax.default_backend()})", flush=True)
  size = DEVICE_MATMUL_SIZE if accelerator() else 2048
  matmul = matmul_gflops(repeats=2 if args.toy else 5, size=size)
  rows = [{"part": "matmul", "size": size, "gflops": matmul, "load1": load()}]
  print(f"matmul: {matmul:.0f} GFLOP/s (float32 {size}^3, jax's default matmul precision)",
        flush=True)
  hparams = nn_hparams(LR, MOMENTUM, WEIGHT_DECAY)
  fedrep_rows, cohort = [], []
  # The precisions in their order, each once; none without the fedrep part.
  precisions = dict.fromkeys(args.precision) if "fedrep" in args.parts else {}
  for precision in precisions:
    model = make_model(MODEL, NUM_CLASSES, precision=precision)
    for part, run in (("e2e", end_to_end), ("round", one_round)):
      fedrep_rows.append({**run(model, sizes[part], hparams, matmul), "precision": precision})
      print(f"{part} ({precision}) done {now()}", flush=True)
  if "cohort" in args.parts:
    cohort = cohort_rows(make_model(MODEL, NUM_CLASSES), sizes["cohort"], hparams, matmul)
  rows += fedrep_rows + cohort
  print(f"\nfinished {now()}")
  if fedrep_rows:
    print(f"\nFedRep on mock CIFAR-10 (r = {PARTICIPATION}, {HEAD_EPOCHS} head + {BODY_EPOCHS} "
          f"body epochs, batch {BATCH}); e2e: {fedrep_rows[0]['rounds']} rounds end to end, "
          f"evaluated every {fedrep_rows[0]['eval_every']}; round: one jitted round")
    print(format_fedrep(fedrep_rows))
    by = {(r["part"], r["precision"]): r["seconds_per_round"] for r in fedrep_rows}
    for other in precisions:
      if other != "float32" and "float32" in precisions:
        print(f"{other} over float32, seconds per round: " + ", ".join(
            f"{part} {by[part, other] / by[part, 'float32']:.2f}" for part in ("e2e", "round")))
  if cohort:
    print(f"\nFedAvg round, {sizes['cohort']['clients']} clients x "
          f"{sizes['cohort']['samples']} samples: vmapped client groups against a per-client loop")
    print(format_table(cohort))
    auto = next(r for r in cohort if r["auto"])
    print(f"* the fastest group. Automatic group {auto['group']}: "
          + (f"free device memory at {gigabytes(auto['client_bytes'], 1e6)} MB per client"
             if accelerator() else "the CPU default")
          + f". After all parts: device peak {gigabytes(auto['peak_device_bytes'])} GB, "
          f"peak RSS {gigabytes(auto['peak_rss_bytes'])} GB")
  if args.json:
    write_json(args.json, {"machine": machine_info(), "toy": args.toy, "rows": rows})


if __name__ == "__main__":
  main()
