"""Traced hyperparameters of the linear algorithms (a sweep over them is a vmap)."""

import jax

from fedjax_rep.core import struct


@struct.dataclass
class LinearHparams:
  """lr: step size of representation (and FedAvg) steps; head_lr: of head GD steps.

  FLUTE only: reg_lr (eta_r, default lr: eta_l = eta_r as in Theorem 5.1) is the step size
  of the regulariser step, with weights gamma1, gamma2 (default 1/4 and 1/8, Theorem 5.1).
  FedRep with head_steps=TRACED_HEAD_STEPS only: head_steps (int32), the number of head GD
  steps of each run (0: the exact least-squares head), so FedRep, GD-GD and tau GD-GD runs
  share one compiled program.
  None fields are not leaves, so sweeps vmap only over the fields that are set.
  """
  lr: jax.Array
  head_lr: jax.Array
  reg_lr: jax.Array | None = None
  gamma1: jax.Array | None = None
  gamma2: jax.Array | None = None
  head_steps: jax.Array | None = None
