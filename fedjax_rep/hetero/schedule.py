"""SRPFL's doubling schedule (Algorithms 1 and 2) and its expected wall-clock time.

Stage r keeps the fastest n_r = min(N, 2^r n0) of the N sampled clients for tau_r rounds;
the last stage (all N) runs the remaining rounds. A schedule is static numpy, known before
the run; `fastest_mask` picks a round's participants under jit.

Expected times (Section 4.1) for compute times per round iid Exp(rate) (u local updates of
Exp(lambda) each: rate = lambda / u) and communication cost C per round:
E[T_SRPFL] = sum_r tau_r (E[T_(n_r)] + C) and E[T_FedRep] = T (E[T_(N)] + C).
"""

import jax
import jax.numpy as jnp
import numpy as np


def _check_positive(name: str, value):
  if not value > 0:
    raise ValueError(f"{name} must be > 0; got {value!r}")


def stage_sizes(num_clients: int, n0: int) -> np.ndarray:
  """Participants n_r = min(N, 2^r n0) [S] of stages r = 0, ..., S-1; the last is N."""
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f"num_clients must be an integer >= 1; got {num_clients!r}")
  if not isinstance(n0, (int, np.integer)) or not 1 <= n0 <= num_clients:
    raise ValueError(f"n0 must be an integer in [1, num_clients={num_clients}]; got {n0!r}")
  sizes = [int(n0)]
  while sizes[-1] < num_clients:
    sizes.append(min(num_clients, 2 * sizes[-1]))
  return np.array(sizes)


def participants(num_clients: int, n0: int, num_rounds: int,
                 stage_rounds) -> tuple[np.ndarray, np.ndarray]:
  """Participants [T] and stage index [T] of each of T = num_rounds rounds.

  stage_rounds: tau (an int >= 1) for every stage before the last, or their rounds [S-1]
  (ints >= 0, e.g. `theorem_stage_rounds`). The last stage runs until round T.
  """
  sizes = stage_sizes(num_clients, n0)
  if not isinstance(num_rounds, (int, np.integer)) or num_rounds < 1:
    raise ValueError(f"num_rounds must be an integer >= 1; got {num_rounds!r}")
  rounds = np.asarray(stage_rounds)
  if rounds.ndim == 0:
    if not np.issubdtype(rounds.dtype, np.integer) or rounds < 1:
      raise ValueError(f"stage_rounds must be an integer >= 1; got {stage_rounds!r}")
    rounds = np.full(len(sizes) - 1, rounds)
  elif (rounds.shape != (len(sizes) - 1,) or not np.issubdtype(rounds.dtype, np.integer)
        or np.any(rounds < 0)):
    raise ValueError(f"stage_rounds must be integers >= 0 [stages before the last="
                     f"{len(sizes) - 1}]; got {stage_rounds!r}")
  stages = np.repeat(np.arange(len(sizes) - 1), rounds)[:num_rounds]
  stages = np.concatenate([stages, np.full(num_rounds - len(stages), len(sizes) - 1)])
  return sizes[stages], stages


def fastest_mask(times: jax.Array, n) -> jax.Array:
  """True [..., N] for the n clients with the smallest times [..., N], ties broken by index:
  exactly n True. n may be traced (ranks from a stable argsort; no top_k with a traced k)."""
  ranks = jnp.argsort(jnp.argsort(times, axis=-1, stable=True), axis=-1)
  return ranks < n


def expected_order_stat(num_clients: int, n, rate: float = 1.0) -> np.ndarray:
  """E[T_(n)], the n-th smallest of N iid Exp(rate): (1/rate) sum_{j=N-n+1}^{N} 1/j.

  n: an int or an int array in [0, N]; the result has its shape.
  """
  _check_positive("rate", rate)
  n = np.asarray(n)
  if not np.all((n >= 0) & (n <= num_clients)):
    raise ValueError(f"n must be in [0, num_clients={num_clients}]; got {n}")
  harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, num_clients + 1))])
  return (harmonic[num_clients] - harmonic[num_clients - n]) / rate


def expected_wall_clock(num_clients: int, participants: np.ndarray, rate: float = 1.0,
                        comm_cost: float = 0.0) -> float:
  """sum_t (E[T_(n_t)] + C) over rounds with participants n_t [T]: E[T_SRPFL] for an SRPFL
  schedule, E[T_FedRep] = T (E[T_(N)] + C) for participants all N."""
  if not comm_cost >= 0:
    raise ValueError(f"comm_cost must be >= 0; got {comm_cost!r}")
  return float(np.sum(expected_order_stat(num_clients, participants, rate) + comm_cost))


def theorem_stage_rounds(num_clients: int, n0: int, a: float, dist0: float,
                         rate: float = 1.0, comm_cost: float = 0.0,
                         floor0: float | None = None) -> np.ndarray:
  """Rounds tau_r [S-1] of the stages before the last, from the contraction of Theorem 4.5.

  In stage r the bound (10) on x = dist(B, B*) is x+ = rho x + g_r, with rho = sqrt(1 - a),
  g_r = a / (sqrt(n_r / n0) (1 - a)) and fixed point F_r = g_r / (1 - rho). With
  e_r = E[T_(n_r)] + C, the progress per unit of time (x (1 - rho) - g_r) / e_r is larger
  with n_{r+1} clients once x is below the doubling point (Lemma B.1, Eq. 196-198)
      X_{r+1} = (g_r e_{r+1} - g_{r+1} e_r) / ((1 - rho) (e_{r+1} - e_r)).
  Starting from x_0 = dist0, stage r runs until the bound reaches X_{r+1}:
      tau_r = ceil(log((x_r - F_r) / (X_{r+1} - F_r)) / log(1 / rho))   (0 if x_r <= X_{r+1}),
      x_{r+1} = F_r + rho^tau_r (x_r - F_r).
  From one doubling point to the next (n_{r+1} = 2 n_r) this is Eq. 206, with
  D_r = E[T_(n_r)] - E[T_(n_{r-1})]: tau_r = 2 log(sqrt(2) D_{r+1} / D_r) / log(1 / (1 - a)).
  a = eta E0 sigma_min^2 / 2 (the theorem has a <= 1/4) is accepted in (0, 1). The bound's
  noise floor F_0 is about 2, so with dist0 <= 1 early stages may get 0 rounds. Calibrated
  use: floor0 sets F_0 (e.g. a measured floor with n0 clients) and F_r = F_0 sqrt(n0 / n_r),
  the 1/sqrt(n_r) law of the bound's noise term (g_r = F_r (1 - rho)).
  """
  sizes = stage_sizes(num_clients, n0)
  if not 0 < a < 1:
    raise ValueError(f"a must be in (0, 1) (the theorem has a <= 1/4); got {a!r}")
  _check_positive("dist0", dist0)
  if not comm_cost >= 0:
    raise ValueError(f"comm_cost must be >= 0; got {comm_cost!r}")
  rho = np.sqrt(1 - a)
  g = a / (np.sqrt(sizes / n0) * (1 - a))
  if floor0 is not None:
    _check_positive("floor0", floor0)
    g = floor0 * (1 - rho) / np.sqrt(sizes / n0)
  e = expected_order_stat(num_clients, sizes, rate) + comm_cost
  floor = g / (1 - rho)
  switch = (g[:-1] * e[1:] - g[1:] * e[:-1]) / ((1 - rho) * (e[1:] - e[:-1]))
  rounds, x = [], dist0
  for r in range(len(sizes) - 1):
    tau = 0 if x <= switch[r] else int(np.ceil(
        np.log((x - floor[r]) / (switch[r] - floor[r])) / np.log(1 / rho)))
    x = floor[r] + rho**tau * (x - floor[r])
    rounds.append(tau)
  return np.array(rounds, dtype=int)


def theorem46_ratio(num_clients: int, c_hat: float) -> float:
  """Theorem 4.6's trend of E[T_SRPFL] / E[T_FedRep], up to constants:
  log(1/(c_hat - 1)) / (log N + log(1/(c_hat - 1))), for iid Exp(lambda) compute times and
  C = c / lambda with any constant c.

  c_hat in (1, sqrt(2)) sets the target accuracy (Eq. 11) as c_hat times the noise floor of
  the last stage, with all N clients: eps = c_hat a / (sqrt(N/n0) (1 - a) (1 - sqrt(1 - a))).
  Near sqrt(2) SRPFL finishes most work before adding the slower half (a log N speed-up);
  near 1 it spends most rounds with all N clients (ratio -> 1).
  """
  if not 1 < c_hat < np.sqrt(2):
    raise ValueError(f"c_hat must be in (1, sqrt(2)); got {c_hat!r}")
  if num_clients < 1:
    raise ValueError(f"num_clients must be >= 1; got {num_clients!r}")
  slack = np.log(1 / (c_hat - 1))
  return float(slack / (np.log(num_clients) + slack))
