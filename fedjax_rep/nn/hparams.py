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
  the valid range [low, high] (`open`: (low, high); `high` inf: finite and above low;
  `flag`: 0 or 1 only; `choices`: one of these names, held traced as its index) and a
  one-line `help`; default None: the algorithm computes it (the help says how).
  `set_by_recipe`: a recipe sets it itself (the conventions' flags, the epoch counts of
  `program.program`), not a --set key."""
  name: str
  default: float | str | None
  low: float = 0.0
  high: float = math.inf
  help: str = ""
  flag: bool = False
  choices: tuple[str, ...] = ()
  open: bool = False
  set_by_recipe: bool = False

  def valid(self, value) -> bool:
    """Whether `value` is in range (NaN never is): a number, or for choices a name or an
    index."""
    if self.flag:
      return value in (0, 1)
    if self.choices:
      return value in self.choices or value in range(len(self.choices))
    if self.open:
      return self.low < value < self.high and math.isfinite(value)
    return self.low <= value <= self.high and math.isfinite(value)

  def describe(self) -> str:
    """The valid range in words, e.g. 'finite and >= 0', 'in (0, 1)' or 'one of a, b'."""
    if self.flag:
      return "0 or 1"
    if self.choices:
      return "one of " + ", ".join(self.choices)
    if self.high == math.inf:
      return f"finite and {'>' if self.open else '>='} {self.low:g}"
    left, right = "()" if self.open else "[]"
    return f"in {left}{self.low:g}, {self.high:g}{right}"

  def check(self, value) -> None:
    """ValueError (one line, naming the option and its range) unless `value` is valid."""
    if not self.valid(value):
      raise ValueError(f"{self.name}={value!r} is out of range: {self.name} must be "
                       f"{self.describe()} ({self.help})")

  def number(self, value) -> float:
    """The number hparams hold for the valid `value`: a choice's index, else the value."""
    return float(self.choices.index(value) if value in self.choices else value)


def epochs_option(name: str) -> "Option":
  """The option of how many of an algorithm's `name` epochs run (at most the field's value;
  absent: all of them), which `partial.program` sets."""
  return Option(name, None, help=f"how many of the algorithm's {name} run (default: all)",
                set_by_recipe=True)


# {name: Option} of every option a registered neural algorithm declares (`core.registry.register`
# records them): the options `hparams` takes by default.
KNOWN: dict[str, Option] = {}


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
      algorithm declares, KNOWN).
    **options: algorithms' options by name (docs/neural.md lists the built-in ones: the
      baselines' numbers such as prox_mu, mtl_lambda and mtl_omega, and the conventions'
      flags), each in its declared range; a choice option by its name.

  Returns:
    NNHparams whose numbers are float32 scalars [] (a choice option's: its index).

  Raises:
    ValueError: an unknown option, or a value out of its range.
  """
  known = KNOWN if known is None else known
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
      options={name: np.float32(known[name].number(value))
               for name, value in options.items()}))
