"""One registry of every algorithm, linear and neural (`fedjax-rep list` shows both).

An entry maps a name (or a pattern of names, e.g. 'Ngd-gd') of a family ('linear',
'neural') to a one-line summary and a factory `make(name, **structure) -> algorithm`.
Families register their entries when their registry module is imported.
"""

import dataclasses
import re
from collections.abc import Callable

FAMILIES = ("linear", "neural")


@dataclasses.dataclass(frozen=True)
class Entry:
  """A registered algorithm: `name` as listed; `pattern` (a regex) when the name carries a
  number (e.g. r'(\\d*)gd-gd'); make(name, **structure) builds it; `options`: the traced
  options it declares (neural: `nn.hparams.Option`s)."""
  family: str
  name: str
  summary: str
  make: Callable
  pattern: str | None = None
  options: tuple = ()

  def matches(self, name: str) -> bool:
    return name == self.name or bool(self.pattern and re.fullmatch(self.pattern, name))


ALGORITHMS: dict[str, dict[str, Entry]] = {family: {} for family in FAMILIES}


def register(family: str, name: str, summary: str, make: Callable,
             pattern: str | None = None, options: tuple = ()) -> Entry:
  entry = Entry(family, name, summary, make, pattern, options)
  ALGORITHMS[family][name] = entry
  return entry


def lookup(name: str, family: str) -> Entry:
  """The entry of `family` that `name` matches; ValueError naming the known ones if none."""
  if family not in ALGORITHMS:
    raise ValueError(f"unknown algorithm family {family!r}; known: {', '.join(FAMILIES)}")
  for entry in ALGORITHMS[family].values():
    if entry.matches(name):
      return entry
  raise ValueError(f"unknown {family} algorithm {name!r}; known: "
                   f"{', '.join(ALGORITHMS[family])}")


def make(name: str, family: str, **structure):
  """The algorithm registered as `name` in `family`, built with `structure`."""
  return lookup(name, family).make(name, **structure)
