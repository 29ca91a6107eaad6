"""Traced hyperparameters of the neural algorithms (a sweep over them is a vmap), and the
options an algorithm declares (`Option`): its own traced numbers, by name."""

import dataclasses
import math

import jax
import numpy as np

from fedjax_rep.core import struct

# The options (int []) that `program.program` sets, so that variants of an algorithm that
# differ only in these epochs share one program: how many of its `ft_epochs` of fine-tuning
# run before testing (FedAvg, FedProx, SCAFFOLD), of its `head_epochs` (FLUTE).
FT_EPOCHS = "ft_epochs"
HEAD_EPOCHS = "head_epochs"


@dataclasses.dataclass(frozen=True)
class Option:
  """A traced hyperparameter an algorithm declares (in its class attribute `options`, a
  tuple of these): `name`, the `default` the algorithm uses where hparams leave it out,
  the valid range [low, high] (`high` inf: finite and >= low; `flag`: 0 or 1 only) and a
  one-line `help`; default None: the algorithm computes it (the help says how)."""
  name: str
  default: float | None
  low: float = 0.0
  high: float = math.inf
  help: str = ""
  flag: bool = False

  def valid(self, value) -> bool:
    """Whether the number `value` is in range (NaN never is)."""
    if self.flag:
      return value in (0, 1)
    return self.low <= value <= self.high and math.isfinite(value)

  def describe(self) -> str:
    """The valid range in words, e.g. 'finite and >= 0' or 'in [0, 1]'."""
    if self.flag:
      return "0 or 1"
    if self.high == math.inf:
      return f"finite and >= {self.low:g}"
    return f"in [{self.low:g}, {self.high:g}]"

  def check(self, value) -> None:
    """ValueError (one line, naming the option and its range) unless `value` is valid."""
    if not self.valid(value):
      raise ValueError(f"{self.name}={value!r} is out of range: {self.name} must be "
                       f"{self.describe()} ({self.help})")


def epochs_option(name: str) -> "Option":
  """The option of how many of an algorithm's `name` epochs run (at most the field's value;
  absent: all of them), which `partial.program` sets."""
  return Option(name, None, help=f"how many of the algorithm's {name} run (default: all)")


def declared(algorithm) -> dict[str, Option]:
  """{name: Option} that `algorithm` (an instance or a class) declares: the `options` class
  attributes along its classes, a subclass's replacing a base's of the same name."""
  cls = algorithm if isinstance(algorithm, type) else type(algorithm)
  out = {}
  for base in reversed(cls.__mro__):
    out.update({option.name: option for option in vars(base).get("options", ())})
  return out


@struct.dataclass
class NNHparams:
  """Local SGD of every phase (head, body, joint, fine-tuning): step size `lr`, heavy-ball
  `momentum` and L2 `weight_decay` (added to the gradient before momentum, as PyTorch's
  SGD does); `options`: the algorithms' own traced scalars by name (their `Option`s; an
  absent one takes the algorithm's default, and which are present is structure: adding
  one recompiles, changing its value does not). Numbers, so the optax transform is built
  inside the round and nothing recompiles when they change."""
  lr: jax.Array
  momentum: jax.Array
  weight_decay: jax.Array
  options: dict = dataclasses.field(default_factory=dict)


def hparams(lr: float = 0.01, momentum: float = 0.5, weight_decay: float = 1e-4, *,
            known: dict[str, Option] | None = None, **options: float) -> NNHparams:
  """NNHparams of float32 scalars; the defaults are those of FedRep's code.

  Args:
    lr: the SGD step size (> 0; default 0.01).
    momentum: the heavy-ball momentum, in [0, 1) (default 0.5).
    weight_decay: the L2 weight decay (>= 0; default 1e-4).
    known: {name: Option} the options may be (None: every option that a registered neural
      algorithm declares, `registry.options`).
    **options: algorithms' options by name (`fedjax-rep list` and docs/neural.md list the
      built-in ones: mtl_lambda and the conventions' flags feature_sum, average_untrained,
      no_bias_decay, uniform_average), each in its declared range.

  Returns:
    NNHparams whose numbers are float32 scalars [].

  Raises:
    ValueError: an unknown option, or a value out of its range.
  """
  if known is None:
    from fedjax_rep.nn import registry  # the registry imports the algorithms, which import this
    known = registry.options()
  unknown = sorted(set(options) - set(known))
  if unknown:
    raise ValueError(f"unknown hparams options {unknown}; known: {sorted(known)}")
  for name, value, ok, valid in (("lr", lr, lr > 0, "> 0"),
                                 ("momentum", momentum, 0 <= momentum < 1, "in [0, 1)"),
                                 ("weight_decay", weight_decay, weight_decay >= 0, ">= 0")):
    if not ok:  # NaN fails every comparison
      raise ValueError(f"{name}={value!r} is out of range: {name} must be {valid}")
  for name, value in options.items():
    known[name].check(value)
  return jax.device_put(NNHparams(  # numpy scalars placed: no device program compiles
      lr=np.float32(lr), momentum=np.float32(momentum), weight_decay=np.float32(weight_decay),
      options={name: np.float32(value) for name, value in options.items()}))
