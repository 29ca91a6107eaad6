"""What the SRPFL recipes share: configuration, timed runs, targets and time to target.

Linear SRPFL (Algorithm 2): FedRep with method-of-moments init, m fresh samples per client
per round, exact heads, one GD step on B, server average, QR. All M = N clients are
sampled every round; SRPFL keeps the fastest n_r of them (doubling from n0), FedRep waits
for all N, `fastest-n` keeps the fastest n0 every round. The clock is simulated inside
every round (slowest kept client's time + C); algorithms and C are hyperparameters of one
`Timed` program, so a panel (N, speed model) is one vmapped run. Target (Eq. 11):
eps = c_hat x FedRep's measured floor (its mean principal angle over its last
`floor_rounds` rounds, per seed); a run reaches eps at the first round where its angle,
averaged over the last `smooth_rounds` rounds, is <= eps. Rounds per stage:
`schedule=fixed` runs `stage_rounds` per stage; `schedule=theorem` uses Theorem 4.5's rule
(`hetero.schedule.theorem_stage_rounds`) with its constants calibrated on a pilot FedRep
run (docs/papers/srpfl.md).
"""

import dataclasses

import numpy as np

from fedjax_rep.hetero import schedule, speeds, timed
from fedjax_rep.linear.fedrep import FedRep
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.recipes.kit import linear
from fedjax_rep.recipes.kit import shared

DEFAULT_ALGORITHMS = ("srpfl", "fedrep", "fastest-n")


@dataclasses.dataclass(frozen=True)
class TimedConfig(linear.Problem):
  """Fields every SRPFL recipe has."""
  UNSHARDED = "SRPFL's timed schedules"
  rounds: int = cfg.rounds(400)
  noise_std: float = linear.noise_std(0.1)
  n0: int = cfg.positive_int("SRPFL's initial participants n0 (and fastest-n's n)", 10)
  schedule: str = cfg.choice("rounds per stage: fixed (stage_rounds each) or theorem "
                             "(Theorem 4.5's rule, calibrated on a pilot FedRep run)", "fixed",
                             ("fixed", "theorem"))
  stage_rounds: int = cfg.positive_int("rounds tau per SRPFL stage (schedule=fixed)", 20)
  c_hat: float = cfg.setting(1.1, cfg.Check(float, low=1.0, open_low=True),
                             "target distance = c_hat x FedRep's measured floor (Eq. 11)")
  floor_rounds: int = cfg.positive_int("last rounds of FedRep averaged into its floor", 100)
  init: str = cfg.choice("initial B: moments (Algorithm 2: all N clients' first batch) or a "
                         "random orthonormal B (dist(B0, B*) ~ 1 whatever N)", "moments",
                         ("moments", "random"))
  smooth_rounds: int = cfg.positive_int("rounds averaged when testing whether a run has "
                                        "reached the target", 10)

  def check_timed(self, client_counts):
    linear.check_rep_dim(self)
    if self.n0 > min(client_counts):
      raise cfg.ConfigError(f"n0={self.n0} is out of range: n0 must be an integer in "
                            f"[1, num_clients={min(client_counts)}]")
    for key in ("floor_rounds", "smooth_rounds"):
      if getattr(self, key) > self.rounds:
        raise cfg.ConfigError(f"{key}={getattr(self, key)} is out of range: it must be an "
                              f"integer in [1, rounds={self.rounds}]")


@dataclasses.dataclass(frozen=True)
class Panels:
  """The panels of an SRPFL figure (linear or neural): a row per client speed model, a
  column per communication cost."""
  speed_models: tuple = cfg.choice("client speed models, one row of panels each",
                                   ("fixed", "dynamic"), ("fixed", "dynamic"), sequence=True)
  comm_costs: tuple = cfg.setting((0.0, 10.0, 100.0), cfg.Check(float, low=0.0, sequence=True),
                                  "communication costs C per round, one column each")


def label(name: str) -> str:
  """An algorithm's name in the SRPFL figures (`labels.label`), FedRep's saying that it
  waits for all N clients."""
  return labels.label(name) + (" (all N)" if name == "fedrep" else "")


def speed_model(kind: str, num_clients: int) -> speeds.SpeedModel:
  """'fixed': Exp(1) per client, drawn once; 'dynamic': Exp(lambda_i) every round."""
  return speeds.fixed_speeds(num_clients) if kind == "fixed" else speeds.dynamic_speeds(
      num_clients)


def calibrate(angles: np.ndarray, floor_rounds: int) -> dict:
  """Theorem 4.5's constants from FedRep's principal angles [seeds, T] (see the module):
  {'a', 'dist0', 'floor'} with floor F_N the mean over the last floor_rounds rounds."""
  mean = angles.mean(axis=0)
  floor = float(mean[-floor_rounds:].mean())
  t = max(int(np.argmax(mean <= 3 * floor)), 1)
  rho = (mean[t] / mean[0]) ** (1.0 / t)
  return {"a": float(np.clip(1 - rho ** 2, 1e-6, 1 - 1e-6)), "dist0": float(mean[0]),
          "floor": floor}


def participants(name: str, config, num_clients: int, comm_cost: float,
                 calibration: dict | None = None) -> np.ndarray:
  """n_t [rounds] of `name`: srpfl (doubling from n0; `calibration` for
  schedule=theorem), fedrep (all N), fastest-n (n0)."""
  if name != "srpfl":
    n = num_clients if name == "fedrep" else config.n0
    return timed.fixed_participants(num_clients, n, config.rounds)
  tau = config.stage_rounds
  if config.schedule == "theorem":
    tau = schedule.theorem_stage_rounds(
        num_clients, config.n0, calibration["a"], calibration["dist0"], comm_cost=comm_cost,
        floor0=calibration["floor"] * np.sqrt(num_clients / config.n0))
  return timed.srpfl_participants(num_clients, config.n0, config.rounds, tau)


def first_hit(metrics, targets, window: int):
  """(rounds [seeds], times [seeds]): the first round (1-based) whose principal angle,
  averaged over the last `window` rounds, is <= targets [seeds], and the wall clock then;
  NaN where never."""
  angles = metrics["principal_angle"]
  sums = np.cumsum(np.pad(angles, ((0, 0), (1, 0))), axis=1)
  smoothed = (sums[:, window:] - sums[:, :-window]) / window  # rounds window..T
  hits = smoothed <= targets[:, None]
  reached = hits.any(axis=1)
  index = np.argmax(hits, axis=1) + window - 1
  times = np.take_along_axis(metrics["wall_clock"], index[:, None], axis=1)[:, 0]
  return np.where(reached, index + 1.0, np.nan), np.where(reached, times, np.nan)


def expected_time(participants: np.ndarray, num_clients: int, rounds: float,
                  comm_cost: float) -> float:
  """E[wall clock] of the first `rounds` rounds with n_t = participants[t] [T] kept of N
  clients with i.i.d. Exp(1) times: sum_t (E[T_(n_t)] + C) (Section 4.1); NaN for NaN."""
  if np.isnan(rounds):
    return np.nan
  return schedule.expected_wall_clock(num_clients, participants[:int(rounds)], 1.0, comm_cost)


def run_panel(config, keys, batch, *, num_clients, speed, comm_costs, algorithms):
  """Rows of `algorithms` x comm_costs x seeds on N = num_clients with one speed model: one
  vmapped program (algorithms and C are hyperparameters). Every row carries the seed's
  target and the run's rounds_to_target, time_to_target and, for fixed Exp(1) speeds,
  expected_time_to_target."""
  seeds = keys.shape[0]
  seed_values = config.seed_values(seeds)
  data = linear.seed_data(keys, num_clients=num_clients, dim=config.dim,
                          rep_dim=config.rep_dim, noise_std=config.noise_std,
                          samples=config.samples_per_client, mode="fresh")
  names = ("fedrep", *[a for a in algorithms if a != "fedrep"])
  algorithm = timed.Timed(FedRep(rep_dim=config.rep_dim, cohort=num_clients,
                                 init_method=config.init, orthonormalize=True),
                          speed_model(speed, num_clients), cohort=num_clients)
  label = f"N{num_clients}-{speed}"

  def run(unit_name, schedules, logged):
    """metrics [names, C, seeds, T] of the runs with participants schedules[name, C] (the
    tracker logs them where `logged`)."""
    runs = [(name, c, n_t) for name in names for c, n_t in zip(comm_costs, schedules[name])]
    results = batch.train(
        unit_name, algorithm, data,
        [timed.hparams(linear.hparams(config), n_t, c) for _, c, n_t in runs],
        shared.run_keys(keys), config.rounds, members=[
            shared.members(name, seed_values, num_clients=num_clients, speed_model=speed,
                           comm_cost=c) for name, c, _ in runs] if logged else None)
    return {k: np.stack([r["metrics"][k] for r in results]).reshape(
        len(names), len(comm_costs), seeds, -1) for k in results[0]["metrics"]}

  calibration = None
  if config.schedule == "theorem":  # a pilot: every run as FedRep, same program
    pilot = run(f"{label}-pilot", {name: [participants("fedrep", config, num_clients, c)
                                          for c in comm_costs] for name in names}, False)
    calibration = calibrate(pilot["principal_angle"][0, 0], config.floor_rounds)
  schedules = {name: [participants(name, config, num_clients, c, calibration)
                      for c in comm_costs] for name in names}
  metrics = run(label, schedules, True)
  rows = []
  for j, c in enumerate(comm_costs):
    floor = metrics["principal_angle"][0, j, :, -config.floor_rounds:].mean(axis=1)
    targets = config.c_hat * floor
    for i, name in enumerate(names):
      if name not in algorithms:
        continue
      part = {k: v[i, j] for k, v in metrics.items()}
      rounds, times = first_hit(part, targets, config.smooth_rounds)
      for s in range(seeds):
        expected = (expected_time(schedules[name][j], num_clients, rounds[s], c)
                    if speed == "fixed" else np.nan)
        for row in shared.round_rows(
            name, seed_values[s:s + 1], {k: v[s:s + 1] for k, v in part.items()},
            num_clients=num_clients, speed_model=speed, comm_cost=c):
          rows.append({**row, "target": float(targets[s]),
                       "rounds_to_target": float(rounds[s]),
                       "time_to_target": float(times[s]), "expected_time_to_target": expected})
  return rows
