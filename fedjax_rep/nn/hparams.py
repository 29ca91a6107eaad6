"""Traced hyperparameters of the neural algorithms (a sweep over them is a vmap)."""

import dataclasses
import math

import jax
import numpy as np

from fedjax_rep.core import struct
from fedjax_rep.nn import conventions

# Algorithm-specific traced hyperparameters `hparams` accepts, with their valid range.
OPTIONS = {"mtl_lambda": "finite and >= 0 (Fed-MTL's regulariser weight)",
           **{flag: f"0 or 1 (1: the authors' code's {knob}; `conventions`)"
              for knob, flag in conventions.OPTIONS.items()}}
# The options (int []) that `program.program` sets, so that variants of an algorithm that
# differ only in these epochs share one program: how many of its `ft_epochs` of fine-tuning
# run before testing (FedAvg, FedProx, SCAFFOLD), of its `head_epochs` (FLUTE).
FT_EPOCHS = "ft_epochs"
HEAD_EPOCHS = "head_epochs"


@struct.dataclass
class NNHparams:
  """Local SGD of every phase (head, body, joint, fine-tuning): step size `lr`, heavy-ball
  `momentum` and L2 `weight_decay` (added to the gradient before momentum, as PyTorch's
  SGD does); `options`: algorithm-specific scalars by name (OPTIONS; an absent one takes
  the algorithm's default, and which are present is structure: adding one recompiles,
  changing its value does not). Numbers, so the optax transform is built inside the round
  and nothing recompiles when they change."""
  lr: jax.Array
  momentum: jax.Array
  weight_decay: jax.Array
  options: dict = dataclasses.field(default_factory=dict)


def hparams(lr: float = 0.01, momentum: float = 0.5, weight_decay: float = 1e-4,
            **options: float) -> NNHparams:
  """NNHparams of float32 scalars; the defaults are those of FedRep's code.

  Args:
    lr: the SGD step size (> 0; default 0.01).
    momentum: the heavy-ball momentum, in [0, 1) (default 0.5).
    weight_decay: the L2 weight decay (>= 0; default 1e-4).
    **options: the algorithm-specific ones of OPTIONS (mtl_lambda, and the conventions'
      flags: feature_sum, average_untrained, no_bias_decay, uniform_average), by name.

  Returns:
    NNHparams whose numbers are float32 scalars [].

  Raises:
    ValueError: an unknown option, or a value out of its range.
  """
  unknown = sorted(set(options) - set(OPTIONS))
  if unknown:
    raise ValueError(f"unknown hparams options {unknown}; known: {sorted(OPTIONS)}")
  for name, value, ok, valid in (("lr", lr, lr > 0, "> 0"),
                                 ("momentum", momentum, 0 <= momentum < 1, "in [0, 1)"),
                                 ("weight_decay", weight_decay, weight_decay >= 0, ">= 0"),
                                 *((name, value, valid_option(name, value), OPTIONS[name])
                                   for name, value in options.items())):
    if not ok:  # NaN fails every comparison
      raise ValueError(f"{name}={value!r} is out of range: {name} must be {valid}")
  return jax.device_put(NNHparams(  # numpy scalars placed: no device program compiles
      lr=np.float32(lr), momentum=np.float32(momentum), weight_decay=np.float32(weight_decay),
      options={name: np.float32(value) for name, value in options.items()}))


def valid_option(name: str, value: float) -> bool:
  """Whether `value` is in the range of option `name`: 0 or 1 for the conventions' flags,
  finite and >= 0 for the others."""
  if name in conventions.OPTIONS.values():
    return value in (0, 1)
  return 0 <= value < math.inf
