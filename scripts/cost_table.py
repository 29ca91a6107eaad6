"""Prints what each method of FedRep's Table-1 CIFAR-10 setting costs per round, as a
markdown table (docs/neural.md, "What each method costs"): bytes a sampled client uploads
and downloads (`nn.cost.communication`) and the FLOPs of one round (`nn.cost.round_flops`).

  python scripts/cost_table.py                 # the recipe's first setting, n = 100, S = 2
  python scripts/cost_table.py --algorithms fedavg fedrep

The setting is the recipe fedrep-table1-cifar10's (its configuration's defaults: n clients,
participation, model, local and head epochs, batch size, conventions, algorithms). The
data are shapes only: CIFAR-10's 50,000 training / 10,000 test images of 32x32x3 split over
the clients as the recipe splits them (`partition.classes` on random balanced labels: only
the split's sizes matter); no image is made, nothing is compiled or trained.
"""

import argparse
import sys
import time

import jax
import numpy as np

from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.data import federated
from fedjax_rep.data import partition as partition_lib
from fedjax_rep.nn import cost
from fedjax_rep.nn import models
from fedjax_rep.recipes.kit import neural
from fedjax_rep.experiments import recipe_registry

RECIPE = "fedrep-table1-cifar10"
TRAIN, TEST, CLASSES, IMAGE = 50_000, 10_000, 10, (32, 32, 3)


def cifar10_shapes(num_clients: int, classes_per_client: int, seed: int, size_sigma: float):
  """ClientDatasets of shapes (`jax.ShapeDtypeStruct` leaves) of CIFAR-10 split over
  `num_clients` clients of `classes_per_client` classes each, as the recipe splits it:
  x [n, m, 32, 32, 3] float32, y [n, m], counts [n], likewise the test split (m, t: the
  largest client's rows)."""
  rng = np.random.default_rng(seed)
  y = rng.permutation(np.repeat(np.arange(CLASSES), TRAIN // CLASSES))
  y_test = rng.permutation(np.repeat(np.arange(CLASSES), TEST // CLASSES))
  parts, test_parts = partition_lib.partition(
      "classes", y, y_test, num_clients=num_clients, seed=seed,
      classes_per_client=classes_per_client, size_sigma=size_sigma)
  m, t = max(map(len, parts)), max(map(len, test_parts))
  spec = jax.ShapeDtypeStruct
  return federated.ClientDatasets(
      x=spec((num_clients, m, *IMAGE), np.float32), y=spec((num_clients, m), np.int32),
      counts=spec((num_clients,), np.int32), x_test=spec((num_clients, t, *IMAGE), np.float32),
      y_test=spec((num_clients, t), np.int32), test_counts=spec((num_clients,), np.int32),
      num_classes=CLASSES)


def rows(config, algorithms, progress=True) -> list[dict]:
  """{method, upload_bytes, download_bytes, flops_per_round} of each of `algorithms` in the
  first setting of `config` (the recipe's configuration)."""
  n, s = config.num_clients[0], config.classes_per_client[0]
  data = cifar10_shapes(n, s, config.seed, config.size_sigma)
  model = models.make_model("cifar10-cnn", precision=config.precision)
  out = []
  for name in algorithms:
    start = time.perf_counter()
    algorithm = neural.algorithm(name, config, model, n)
    base = neural.hparams(config)
    hparams = base.replace(options={**base.options,
                                    **neural.resolved_conventions(config).options(algorithm)})
    row = {"method": name, **cost.communication(algorithm, data, hparams),
           "flops_per_round": cost.round_flops(algorithm, data, hparams)}
    out.append(row)
    if progress:
      print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
  return out


def table(rows: list[dict]) -> str:
  """The markdown table of `rows`."""
  lines = ["| method | upload_bytes | download_bytes | flops_per_round |",
           "|---|---:|---:|---:|"]
  lines += [f"| {r['method']} | {r['upload_bytes']:,} | {r['download_bytes']:,} | "
            f"{r['flops_per_round']:.3e} |" for r in rows]
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--algorithms", nargs="+", default=None,
                      help="the methods (default: the recipe's algorithms)")
  args = parser.parse_args()
  config = recipe_registry.resolve(RECIPE, overrides=["source=mock"])
  start = time.perf_counter()
  result = rows(config, args.algorithms or config.algorithms)
  n, s = config.num_clients[0], config.classes_per_client[0]
  print(f"{RECIPE}, n = {n}, S = {s}: cohort {cohort_lib.cohort_size(n, config.participation)}, "
        f"local_epochs {config.local_epochs}, head_epochs {config.head_epochs}, batch_size "
        f"{config.batch_size}, {config.conventions} conventions (shapes only)\n")
  print(table(result))
  print(f"\n({time.perf_counter() - start:.0f} s)", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
