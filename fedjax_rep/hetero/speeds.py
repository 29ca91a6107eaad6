"""Client speed models: each client's compute time per local update, round by round.

A `SpeedModel` is structure (hashable: a field of a frozen algorithm, static under jit).
`init(model, key)` draws the per-client parameters [N] once per run; `round_times(model,
params, key, t)` gives the times [N] of round t, under jit and vmap.

- fixed: time_i ~ Exp(rate), drawn once, the same every round (SRPFL "fixed speeds").
- dynamic: rate lambda_i ~ U[1/N, 1] drawn once; every round time_i ~ Exp(lambda_i), mean
  1/lambda_i (SRPFL "dynamic speeds").
- given: user times [N], the same every round, or a function (key, t) -> times [N].

With `dropout` p, each client fails to report in a round with probability p (`reporting`).
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class SpeedModel:
  """Speeds of `num_clients` clients: kind "fixed", "dynamic" or "given" (see the module).

  `times` (a tuple, so the model stays hashable) or `fn` hold the user's speeds of "given".
  """
  kind: str
  num_clients: int
  rate: float = 1.0
  dropout: float = 0.0
  times: tuple[float, ...] | None = None
  fn: Callable | None = None


def _check(num_clients: int, dropout: float):
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f"num_clients must be an integer >= 1; got {num_clients!r}")
  if not 0.0 <= dropout < 1.0:
    raise ValueError(f"dropout must be a probability in [0, 1); got {dropout!r}")


def fixed_speeds(num_clients: int, rate: float = 1.0, dropout: float = 0.0) -> SpeedModel:
  """Fixed speeds: times per local update drawn once per client from Exp(rate) (mean 1/rate).

  Args:
    num_clients: N, the number of clients (>= 1).
    rate: the exponential rate (> 0).
    dropout: the probability in [0, 1) that a client fails to report in a round.

  Returns:
    The SpeedModel of kind "fixed".
  """
  _check(num_clients, dropout)
  if not rate > 0:
    raise ValueError(f"rate must be > 0; got {rate!r}")
  return SpeedModel("fixed", int(num_clients), rate=float(rate), dropout=float(dropout))


def dynamic_speeds(num_clients: int, dropout: float = 0.0) -> SpeedModel:
  """Dynamic speeds: times redrawn every round from Exp(lambda_i), lambda_i ~ U[1/N, 1].

  The rates lambda_i are drawn once per run.

  Args:
    num_clients: N, the number of clients (>= 1).
    dropout: the probability in [0, 1) that a client fails to report in a round.

  Returns:
    The SpeedModel of kind "dynamic".
  """
  _check(num_clients, dropout)
  return SpeedModel("dynamic", int(num_clients), dropout=float(dropout))


def given_speeds(times, num_clients: int, dropout: float = 0.0) -> SpeedModel:
  """User speeds: fixed times per local update, or a function of the key and round.

  A function is only traced here to check its shape (nothing is compiled).

  Args:
    times: times [num_clients] (finite, >= 0), the same every round, or a function
      (key, t) -> times [num_clients].
    num_clients: N, the number of clients (>= 1).
    dropout: the probability in [0, 1) that a client fails to report in a round.

  Returns:
    The SpeedModel of kind "given".
  """
  _check(num_clients, dropout)
  if callable(times):
    shape = jax.eval_shape(lambda t: times(jax.random.key(0), t), 0).shape  # key traced
    if shape != (num_clients,):
      raise ValueError(f"the speed function must return times [num_clients={num_clients}]; "
                       f"got shape {shape}")
    return SpeedModel("given", int(num_clients), dropout=float(dropout), fn=times)
  times = np.asarray(times, np.float64)
  if times.shape != (num_clients,):
    raise ValueError(f"times must be an array [num_clients={num_clients}]; got shape "
                     f"{times.shape}")
  if not np.all(np.isfinite(times) & (times >= 0)):
    raise ValueError(f"times must be finite and >= 0; got {times}")
  return SpeedModel("given", int(num_clients), dropout=float(dropout),
                    times=tuple(times.tolist()))


def init(model: SpeedModel, key: jax.Array) -> jax.Array | None:
  """Per-client parameters [N]: fixed times (fixed), rates lambda_i (dynamic), the user's
  times (given array); None for a speed function."""
  n = model.num_clients
  if model.kind == "fixed":
    return jax.random.exponential(key, (n,)) / model.rate
  if model.kind == "dynamic":
    return jax.random.uniform(key, (n,), minval=1.0 / n, maxval=1.0)
  return None if model.times is None else jnp.asarray(model.times, jnp.float32)


def round_times(model: SpeedModel, params: jax.Array | None, key: jax.Array,
                t) -> jax.Array:
  """Time per local update [N] of every client in round t (t may be traced).

  Dynamic times are drawn from fold_in(key, t); a speed function gets (key, t).
  """
  if model.kind == "dynamic":
    return jax.random.exponential(jax.random.fold_in(key, t), params.shape) / params
  if model.fn is not None:
    return model.fn(key, t)
  return params


def reporting(model: SpeedModel, key: jax.Array) -> jax.Array:
  """Clients that report this round, bool [N]: each fails independently with p = dropout."""
  if model.dropout == 0.0:
    return jnp.ones(model.num_clients, bool)
  return jax.random.bernoulli(key, 1.0 - model.dropout, (model.num_clients,))
