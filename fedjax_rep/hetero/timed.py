"""Rounds on a simulated wall clock, with participants chosen by speed: SRPFL and baselines.

`Timed` wraps an algorithm that has `masked_round` (the FedRep family). Every round it
samples a cohort of N clients, draws their times per local update from the speed model,
keeps the fastest n_t of those that report (n_t from a schedule), runs the inner round on
them (the others masked out: static shapes, so a whole run compiles once) and advances the
clock by the slowest kept client's time x local updates + C. Schedules: SRPFL's doubling
n0, 2 n0, 4 n0, ..., N (`srpfl_participants`; Algorithms 1 and 2, the representation
carried across stages), all N every round (`fixed_participants(N, N, T)`, straggler-prone
FedRep) or the fastest n (`fixed_participants(N, n, T)`). `EvaluatedTimed` wraps an
algorithm that also has `evaluate` (the neural ones) and evaluates the inner state every
`eval_every` rounds: SRPFL around neural FedRep, LG-SRPFL around LG-FedAvg, FLANP(-FT)
around FedAvg(-FT). n_t and C are traced (`TimedHparams`), so SRPFL, its baselines and
several C are one vmapped program.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import checks
from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core import struct
from fedjax_rep.core.protocols import Checked, Evaluated, MaskedAlgorithm
from fedjax_rep.core.wrapper import Wrapper
from fedjax_rep.hetero import clock, schedule, speeds as speeds_lib
from fedjax_rep.hetero.speeds import SpeedModel


SCHEDULES = {
    "srpfl": "SRPFL (Alg. 1/2): the fastest n0, 2n0, 4n0, ..., N of N sampled clients, on a "
             "simulated wall clock (hetero.timed)",
    "fedrep": "straggler-prone FedRep on the clock: every round waits for all N (timed recipes)",
    "fastest-n": "the fastest n of N sampled clients every round, on the clock",
}


@struct.dataclass
class TimedHparams:
  """Traced: the inner algorithm's hparams, participants n_t [T] (int32; rounds past the
  end keep the last) and the communication cost C per round. Schedules and costs are
  numbers, so SRPFL, its baselines and several C run as one vmapped program."""
  inner: Any
  participants: jax.Array
  comm_cost: jax.Array


@struct.dataclass
class TimedState:
  """The inner algorithm's state, per-client speed parameters [M] (or None), the simulated
  time elapsed and the number of rounds done."""
  inner: Any
  speed_params: jax.Array | None
  wall_clock: jax.Array
  rounds_done: jax.Array


@dataclasses.dataclass(frozen=True)
class Timed(Wrapper):
  """`inner` on a clock: every round samples a cohort of `cohort` (N) clients and keeps the
  fastest hparams.participants[t] of those that report (see the module docstring)."""
  inner: Any
  speeds: SpeedModel
  cohort: int
  local_updates: int = 1
  name: str = "timed"

  def __post_init__(self):
    if not isinstance(self.inner, MaskedAlgorithm):
      raise TypeError(f"Timed needs a core.protocols.MaskedAlgorithm (with masked_round, "
                      f"quick_compile and tracked_metric); {type(self.inner).__name__} is "
                      f"not one")

  def check(self, data, hparams: TimedHparams) -> None:
    """The checks of a run, before anything compiles (`core.checks`): the inner algorithm's,
    1 <= cohort <= num_clients and participants in [1, cohort] (where concrete)."""
    if not isinstance(hparams, TimedHparams):
      raise TypeError(f"{self.name} takes TimedHparams (fr.timed_hparams(inner, participants, "
                      f"comm_cost)), got {type(hparams).__name__}")
    if isinstance(self.inner, Checked):
      self.inner.check(data, hparams.inner)
    checks.in_range("cohort", self.cohort, 1, data.num_clients, "the number of clients",
                    "sample at most that many clients per round")
    participants = hparams.participants
    if checks.concrete(participants) and not np.all((participants >= 1)
                                                    & (participants <= self.cohort)):
      raise ValueError(f"hparams.participants must be in [1, cohort={self.cohort}] in every "
                       f"round; got {participants.min()} to {participants.max()}: build them "
                       f"with fixed_participants or srpfl_participants")

  def init(self, key, data, hparams: TimedHparams) -> TimedState:
    if self.speeds.num_clients != data.num_clients:
      raise ValueError(f"the speed model has {self.speeds.num_clients} clients but the data "
                       f"has {data.num_clients}")
    key_inner, key_speeds = jax.random.split(key)
    return TimedState(inner=self.inner.init(key_inner, data, hparams.inner),
                      speed_params=speeds_lib.init(self.speeds, key_speeds),
                      wall_clock=jnp.float32(0.0), rounds_done=jnp.int32(0))

  def round(self, state: TimedState, key, data, hparams: TimedHparams):
    key_cohort, key_times, key_report, key_inner = jax.random.split(key, 4)
    clients = cohort_lib.sample_cohort(key_cohort, data.num_clients, self.cohort)
    times = speeds_lib.round_times(self.speeds, state.speed_params, key_times,
                                   state.rounds_done)[clients]
    reporting = speeds_lib.reporting(self.speeds, key_report)[clients]
    schedule_index = jnp.minimum(state.rounds_done, hparams.participants.shape[-1] - 1)
    n = hparams.participants[schedule_index]
    mask = schedule.fastest_mask(jnp.where(reporting, times, jnp.inf), n) & reporting
    inner, metrics = self.inner.masked_round(state.inner, key_inner, data, hparams.inner,
                                             clients, mask)
    elapsed = state.wall_clock + clock.round_duration(times, mask, self.local_updates,
                                                      hparams.comm_cost)
    metrics = {**metrics, "wall_clock": elapsed,
               "participants": jnp.sum(mask).astype(jnp.float32)}
    return TimedState(inner, state.speed_params, elapsed, state.rounds_done + 1), metrics


@dataclasses.dataclass(frozen=True)
class EvaluatedTimed(Timed):
  """`Timed` around an algorithm with `evaluate`: the inner algorithm's metrics of the inner
  state (e.g. every client's test accuracy with its own or fine-tuned params)."""

  def __post_init__(self):
    super().__post_init__()
    if not isinstance(self.inner, Evaluated):
      raise TypeError(f"EvaluatedTimed needs an algorithm with evaluate (core.protocols."
                      f"Evaluated); {type(self.inner).__name__} has none: use Timed")

  def evaluate(self, state: TimedState, data, hparams: TimedHparams) -> dict:
    return self.inner.evaluate(state.inner, data, hparams.inner)


def srpfl_participants(cohort: int, n0: int, num_rounds: int, stage_rounds) -> np.ndarray:
  """SRPFL's participants n_t: stage r keeps the fastest n_r = min(N, 2^r n0) of N clients.

  Stage r lasts stage_rounds[r] rounds; the last stage runs on (`schedule.participants`).

  Args:
    cohort: N, the clients sampled per round.
    n0: the participants of the first stage.
    num_rounds: T, the rounds of the run.
    stage_rounds: the rounds of each stage before the last [S-1] (e.g.
      `schedule.theorem_stage_rounds`), or an int: the same tau for every stage.

  Returns:
    n_t [T] (int32), for `hparams`.
  """
  return schedule.participants(cohort, n0, num_rounds, stage_rounds)[0].astype(np.int32)


def fixed_participants(cohort: int, n: int, num_rounds: int) -> np.ndarray:
  """Participants n_t = n every round.

  n = N is straggler-prone FedRep (it waits for all N sampled clients); n < N keeps the
  fastest n.

  Args:
    cohort: N, the clients sampled per round.
    n: the participants of every round, in [1, N].
    num_rounds: T, the rounds of the run.

  Returns:
    n_t [T] (int32), for `hparams`.
  """
  if not 1 <= n <= cohort:
    raise ValueError(f"n must be an integer in [1, cohort={cohort}]; got {n!r}")
  return np.full(num_rounds, n, np.int32)


def hparams(inner, participants, comm_cost: float = 0.0) -> TimedHparams:
  """TimedHparams of one run; `fr.stack` several to sweep them as one program.

  Args:
    inner: the inner algorithm's hparams.
    participants: n_t [T] from `srpfl_participants` or `fixed_participants`.
    comm_cost: C, the communication cost per round (>= 0).

  Returns:
    TimedHparams with participants int32 [T] and comm_cost a float32 scalar.
  """
  if not comm_cost >= 0:
    raise ValueError(f"comm_cost must be >= 0; got {comm_cost!r}")
  return TimedHparams(inner=inner, participants=np.asarray(participants, np.int32),
                      comm_cost=np.float32(comm_cost))
