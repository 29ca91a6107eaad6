"""Checks of a linear run's data, made before anything compiles.

`check_data`: the data's own `check` (the data modes' methods, `data_modes`) and the cohort
size. `check_scale`: whether the Gram and moment matrices and the losses that linear
training forms from the data stay within float32.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import checks


def check_scale(x_name: str, y_name: str, X, y) -> None:
  """Raises ValueError when the sum over samples of (1 + |x|^2)(1 + y^2), which bounds the
  Gram and moment matrices and the losses that linear training forms, overflows float32;
  X [n, m, d], y [n, m] (finite; numpy, or jax arrays on their accelerator: summed there in
  float32 first, and copied to the host only when that sum comes near float32's limit)."""
  if isinstance(X, jax.Array):
    if float(_scale_bound(X, y)) < checks.FLOAT32_MAX / 2:
      return
    X, y = np.asarray(X), np.asarray(y)
  with np.errstate(over="ignore"):
    squares = np.einsum("nmd,nmd->nm", X, X)  # in X's dtype: overflows to inf
  scale = (1.0 + squares.astype(np.float64)) * (1.0 + y.astype(np.float64) ** 2)
  total = scale.sum()
  if total < checks.FLOAT32_MAX:
    return
  client, sample = np.unravel_index(np.argmax(scale), scale.shape)
  raise ValueError(f"{x_name} and {y_name} are too large for float32: the sum over samples of "
                   f"(1 + |x|^2)(1 + y^2) is {total:.3g}, past float32's "
                   f"{checks.FLOAT32_MAX:.3g} (largest at client {client}, sample {sample}); "
                   f"rescale the data (e.g. standardise X and y)")


@jax.jit
def _scale_bound(X: jax.Array, y: jax.Array) -> jax.Array:
  """`check_scale`'s sum in float32, one fused pass on the arrays' device."""
  return jnp.sum((1.0 + jnp.sum(X * X, axis=-1)) * (1.0 + y * y))


def check_data(data, rep_dim: int, cohort: int | None = None, heads: bool = True) -> None:
  """A linear algorithm's checks of one run's data (`core.protocols.LinearData`; its `check`,
  before anything compiles): the data's own `check` for rep_dim k (`heads`: the clients fit
  heads, so fewer samples than k warn), then 1 <= cohort <= num_clients (None: every client
  takes part every round)."""
  data.check(rep_dim, heads)
  if cohort is not None:
    checks.in_range("cohort", cohort, 1, data.num_clients, "the number of clients",
                    "sample at most that many clients per round")
