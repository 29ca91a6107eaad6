"""Traced hyperparameters of the linear algorithms (a sweep over them is a vmap)."""

import jax
from flax import struct


@struct.dataclass
class LinearHparams:
  """lr: step size of representation (and FedAvg) steps; head_lr: of head GD steps."""
  lr: jax.Array
  head_lr: jax.Array
