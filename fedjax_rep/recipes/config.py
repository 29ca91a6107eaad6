"""Recipe configurations: frozen dataclasses whose fields carry their own valid range.

`--set KEY=VALUE` goes through `override`, and every configuration through `validate`,
before anything is compiled: a bad key or value is a `ConfigError` that names the key,
the value, the valid range and the valid keys.
"""

import dataclasses
import math
import typing


class ConfigError(ValueError):
  """A configuration key or value that cannot be used."""


@dataclasses.dataclass(frozen=True)
class Check:
  """A valid range: numbers in [low, high] (open ends where `open_*`), or one of `choices`."""
  kind: type
  low: float | None = None
  high: float | None = None
  open_low: bool = False
  open_high: bool = False
  choices: tuple | None = None
  sequence: bool = False

  def describe(self) -> str:
    if self.choices is not None:
      text = "one of " + ", ".join(map(str, self.choices))
    else:
      low = "-inf" if self.low is None else f"{self.low:g}"
      high = "inf" if self.high is None else f"{self.high:g}"
      bracket = ("(" if self.open_low or self.low is None else "[",
                 ")" if self.open_high or self.high is None else "]")
      noun = "an integer" if self.kind is int else "a number"
      text = f"{noun} in {bracket[0]}{low}, {high}{bracket[1]}"
    return ("a comma-separated list, each " + text) if self.sequence else text

  def ok(self, value) -> bool:
    if self.choices is not None:
      return value in self.choices
    if self.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
      return False
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
      return False
    if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
      return False
    if self.high is not None and (value > self.high or (self.open_high and value == self.high)):
      return False
    return True


def setting(default, check: Check, help: str):
  """A configuration field with its default, valid range and one-line help."""
  return dataclasses.field(default=default, metadata={"check": check, "help": help})


def positive_int(help, default, *, sequence=False, low=1):
  return setting(default, Check(int, low=low, sequence=sequence), help)


def positive_float(help, default):
  return setting(default, Check(float, low=0.0, open_low=True), help)


def nonnegative_float(help, default):
  return setting(default, Check(float, low=0.0), help)


def fraction(help, default):
  return setting(default, Check(float, low=0.0, high=1.0, open_low=True), help)


def choice(help, default, choices, *, sequence=False):
  return setting(default, Check(str, choices=tuple(choices), sequence=sequence), help)


def fields(config_type) -> dict[str, dataclasses.Field]:
  return {f.name: f for f in dataclasses.fields(config_type)}


def _parse_one(item: str, kind: type):
  if kind is str:
    return item
  number = float(item)
  if kind is int:
    if not number.is_integer():
      raise ValueError(item)
    return int(number)
  return number


def _parse(key: str, text: str, check: Check):
  items = [t.strip() for t in text.split(",") if t.strip()] if check.sequence else [text.strip()]
  values = []
  for item in items:
    try:
      values.append(_parse_one(item, check.kind))
    except (ValueError, OverflowError):
      raise ConfigError(f"--set {key}={text}: {item!r} is not valid; {key} must be "
                        f"{check.describe()}") from None
  return tuple(values) if check.sequence else values[0]


def override(config, items: typing.Sequence[str]):
  """`config` with each 'KEY=VALUE' of `items` applied (parsed by the field's type)."""
  known = fields(type(config))
  changes = {}
  for item in items:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep:
      raise ConfigError(f"--set expects KEY=VALUE, got {item!r}; valid keys: {', '.join(known)}")
    if key not in known:
      raise ConfigError(f"unknown configuration key {key!r}; valid keys: {', '.join(known)}")
    changes[key] = _parse(key, text, known[key].metadata["check"])
  return validate(dataclasses.replace(config, **changes))


def validate(config):
  """Returns `config` if every field is in its range and the cross-field rules hold."""
  for name, field in fields(type(config)).items():
    check, value = field.metadata["check"], getattr(config, name)
    values = value if check.sequence else (value,)
    if check.sequence and (not isinstance(value, tuple) or not value):
      raise ConfigError(f"{name} must be {check.describe()}, got {value!r}")
    for v in values:
      if not check.ok(v):
        raise ConfigError(f"{name}={v!r} is out of range: {name} must be {check.describe()}")
  if hasattr(config, "check"):
    config.check()
  return config


# Fields every recipe uses (DESIGN.md names them).


def num_clients(default):
  return positive_int("number of clients n", default)


def rounds(default):
  return positive_int("communication rounds T", default)


def participation(default):
  return fraction("fraction r of clients sampled each round", default)


def lr(default, what="step size of the representation (and FedAvg) GD steps"):
  return positive_float(what, default)


def seed(default=0):
  return positive_int("seed of the first run (later seeds count up)", default, low=0)
