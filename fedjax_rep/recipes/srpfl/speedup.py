"""srpfl-speedup: simulated time to reach the target distance eps (Eq. 11) as N grows, SRPFL
vs FedRep with full participation, against Theorem 4.6's prediction.

Setting: srpfl-linear's problem (d = 10, k = 2, m = 5 fresh samples, noise std 0.1, lr 0.1,
n0 = 10) with fixed Exp(1) speeds and C = 0, for N in {100, 1000, 10000}; SRPFL's rounds
per stage from Theorem 4.5's rule calibrated on a pilot FedRep run (`schedule=theorem`,
see srpfl_common); eps = c_hat x FedRep's measured floor for that N, c_hat = 1.1 (Eq. 11
asks c_hat in (1, sqrt 2) so that eps needs all N clients; 1.1 < sqrt(N / n_{S-1}) for
every N here). Theorem 4.6: E[T_SRPFL] / E[T_FedRep] = O(log(1/(c_hat - 1)) / (log N +
log(1/(c_hat - 1)))); the plot shows that trend scaled to the measured ratio at the
smallest N (the theorem fixes it only up to a constant), and the ratio of expected times
sum_t (E[T_(n_t)] + C) at the measured numbers of rounds (Section 4.1's formulas).
The theorem assumes dist(B0, B*) bounded away from 0 whatever N; Algorithm 2's
method-of-moments B0 improves with N (all N clients' samples), so `--set init=random` is
the setting closer to the theorem.
"""

import dataclasses

import numpy as np

from fedjax_rep.hetero import schedule
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.kit import shared
from fedjax_rep.recipes.srpfl import common as sc
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(sc.TimedConfig):
  num_clients: tuple = cfg.positive_int("numbers of clients N (x-axis)", (100, 1000, 10000),
                                        sequence=True)
  schedule: str = cfg.choice("rounds per stage: fixed (stage_rounds each) or theorem "
                             "(Theorem 4.5's rule, calibrated on a pilot FedRep run)",
                             "theorem", ("fixed", "theorem"))
  speed_model: str = cfg.choice("client speed model", "fixed", ("fixed", "dynamic"))
  comm_cost: float = cfg.nonnegative_float("communication cost C per round", 0.0)

  def check(self):
    self.check_timed(self.num_clients)


def run(config: Config, seeds: int, batch) -> list[dict]:
  keys = shared.seed_keys(config.seed, seeds)
  rows = []
  for n in config.num_clients:
    rows += sc.run_panel(config, keys, batch, num_clients=n,
                         speed=config.speed_model, comm_costs=(config.comm_cost,),
                         algorithms=("srpfl", "fedrep"))
  return rows


def speedup_table(rows, c_hat: float) -> list[dict]:
  """Per N: mean time (and rounds) to target of SRPFL and FedRep over the seeds that reach
  it, how many did, their ratio, the ratio of expected times, and Theorem 4.6's trend
  scaled to the measured ratio at the first N."""
  table = []
  for n in sorted({r["num_clients"] for r in rows}):
    entry = {"num_clients": n}
    for name in ("srpfl", "fedrep"):
      runs = [r for r in plotting.select(rows, num_clients=n, algorithm=name) if r["round"] == 1]
      for key in ("time_to_target", "rounds_to_target", "expected_time_to_target"):
        entry[f"{name}_{key}"] = float(np.nanmean([r[key] for r in runs]))
      reached = sum(np.isfinite(r["time_to_target"]) for r in runs)
      entry[f"{name}_reached"] = f"{reached}/{len(runs)}"
    entry["ratio"] = entry["srpfl_time_to_target"] / entry["fedrep_time_to_target"]
    entry["expected_ratio"] = (entry["srpfl_expected_time_to_target"]
                               / entry["fedrep_expected_time_to_target"])
    table.append(entry)
  if 1 < c_hat < np.sqrt(2):
    scale = table[0]["ratio"] / schedule.theorem46_ratio(table[0]["num_clients"], c_hat)
    for entry in table:
      entry["theorem46"] = scale * schedule.theorem46_ratio(entry["num_clients"], c_hat)
  return table


def plot(rows, config: Config, file) -> None:
  fig, (left, right) = plotting.figure(2, width=5.0)
  first_rows = [r for r in rows if r["round"] == 1]
  for name in ("srpfl", "fedrep"):
    plotting.line(left, first_rows, "num_clients", "time_to_target", sc.label(name),
                  algorithm=name)
  left.set(xscale="log", yscale="log", xlabel="clients N", ylabel="simulated time to target",
           title=f"time to reach ε = {config.c_hat:g} × FedRep's floor")
  table = speedup_table(rows, config.c_hat)
  ns = [t["num_clients"] for t in table]
  right.plot(ns, [t["ratio"] for t in table], marker="o", color="tab:purple",
             label="speed-up, measured")
  if config.speed_model == "fixed":
    right.plot(ns, [t["expected_ratio"] for t in table], marker="s", ls=":", color="tab:gray",
               label="speed-up, expected times at the measured rounds")
  if "theorem46" in table[0]:
    right.plot(ns, [t["theorem46"] for t in table], ls="--", color="black",
               label="Theorem 4.6 trend (scaled at the first N)")
  right.set(xscale="log", yscale="log", xlabel="clients N",
            ylabel=r"$T_\mathrm{SRPFL}/T_\mathrm{FedRep}$", title="speed-up of SRPFL")
  fig.suptitle(f"SRPFL speed-up: {config.speed_model} speeds, C={config.comm_cost:g}, "
               f"n0={config.n0}, d={config.dim}, k={config.rep_dim}")
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="srpfl-speedup",
    rank=110,
    docs="docs/papers/srpfl.md",
    summary="SRPFL: simulated time to the target distance vs N in {100, 1000, 10000}, SRPFL vs "
            "FedRep, against Theorem 4.6",
    config=Config, quick={"rounds": 300, "floor_rounds": 60, "num_clients": (100, 1000)},
    run=run, plot=plot,
    default_seeds=10))
