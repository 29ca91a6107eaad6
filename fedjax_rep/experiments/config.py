"""Recipe configurations: frozen dataclasses (derived from `Config`) whose fields carry
their own valid range.

`--set KEY=VALUE` goes through `override`, `--grid KEY=V1,V2,...` through `sweep`
(which checks every combination of the sweep), and every configuration through `validate`,
before anything is compiled: a bad key or value is a `ConfigError` that names the key,
the value, the valid range and the valid keys.

A configuration with a field `options` (a tuple of (name, value) pairs, not a key itself)
also takes as keys the traced options its algorithms declare (`Config.declared_options`):
`--set server_beta=0.9` stores ("server_beta", 0.9) in `options`, each value checked by
its Option.
"""

import dataclasses
import itertools
import math
import re
import typing
from collections.abc import Callable


class ConfigError(ValueError):
  """A configuration key or value that cannot be used."""


@dataclasses.dataclass(frozen=True)
class Check:
  """A valid range: numbers in [low, high] (open ends where `open_*`), or one of `choices`
  (a tuple, or a function returning one when checked: e.g. the algorithms registered by
  then); with `optional`, also None ('auto' on the command line: what `auto` says, by
  default the algorithm's own default); with `words`, also these strings (e.g.
  devices=all)."""
  kind: type
  low: float | None = None
  high: float | None = None
  open_low: bool = False
  open_high: bool = False
  choices: tuple | Callable[[], tuple] | None = None
  sequence: bool = False
  optional: bool = False
  words: tuple = ()
  auto: str = "the algorithm's default"

  def valid_choices(self) -> tuple | None:
    """The choices as of now (None: a range, not choices)."""
    return self.choices() if callable(self.choices) else self.choices

  def describe(self) -> str:
    if self.choices is not None:
      text = "one of " + ", ".join(map(str, self.valid_choices()))
    else:
      low = "-inf" if self.low is None else f"{self.low:g}"
      high = "inf" if self.high is None else f"{self.high:g}"
      bracket = ("(" if self.open_low or self.low is None else "[",
                 ")" if self.open_high or self.high is None else "]")
      noun = "an integer" if self.kind is int else "a number"
      text = f"{noun} in {bracket[0]}{low}, {high}{bracket[1]}"
    if self.optional:
      text += f" or auto ({self.auto})"
    for word in self.words:
      text += f" or {word}"
    return ("a comma-separated list, each " + text) if self.sequence else text

  def ok(self, value) -> bool:
    if value is None:
      return self.optional
    if isinstance(value, str) and value in self.words:
      return True
    if self.choices is not None:
      return value in self.valid_choices()
    if self.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
      return False
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
      return False
    if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
      return False
    if self.high is not None and (value > self.high or (self.open_high and value == self.high)):
      return False
    return True


def setting(default, check: Check, help: str, *, listed_last: bool = False):
  """A configuration field with its default, valid range and one-line help; `listed_last`:
  after the recipe's own fields where keys are listed (settings every recipe has)."""
  return dataclasses.field(default=default, metadata={"check": check, "help": help,
                                                      "listed_last": listed_last})


def positive_int(help, default, *, sequence=False, low=1):
  return setting(default, Check(int, low=low, sequence=sequence), help)


def positive_float(help, default):
  return setting(default, Check(float, low=0.0, open_low=True), help)


def nonnegative_float(help, default):
  return setting(default, Check(float, low=0.0), help)


def fraction(help, default):
  return setting(default, Check(float, low=0.0, high=1.0, open_low=True), help)


def choice(help, default, choices, *, sequence=False):
  """One of `choices` (a function returning them is called when a value is checked)."""
  choices = choices if callable(choices) else tuple(choices)
  return setting(default, Check(str, choices=choices, sequence=sequence), help)


def fields(config_type) -> dict[str, dataclasses.Field]:
  """{name: field} of the keys of `config_type` (its fields made by `setting`; not
  `options`), those listed last after the others."""
  return {f.name: f for f in sorted(dataclasses.fields(config_type),
                                    key=lambda f: f.metadata.get("listed_last", False))
          if "check" in f.metadata}


def saved(config) -> dict:
  """What config.json records of `config` (`runner.replay` gives it back as --set items):
  the value of each of its keys and its `options`, as `dataclasses.asdict` gives them; not
  its other fields (e.g. a dataset that the recipe sets)."""
  keys = fields(type(config))
  return {name: value for name, value in dataclasses.asdict(config).items()
          if name in keys or name == "options"}


def takes_options(config) -> bool:
  """Whether `config` takes its algorithms' traced options as keys (it has a field
  `options`)."""
  return any(f.name == "options" for f in dataclasses.fields(config))


def with_options(config, values: dict):
  """`config` with the traced options `values` ({name: number}) added to its `options`
  (replacing those of the same name; None, 'auto': left out, the algorithm's default),
  sorted by name; not validated."""
  merged = {k: v for k, v in {**dict(config.options), **values}.items() if v is not None}
  return dataclasses.replace(config, options=tuple(sorted(merged.items())))


def option_check(option) -> Check:
  """The Check of the values of an `nn.hparams.Option`: its range (0 or 1 for a flag, one
  of its names for choices; also 'auto' where the algorithm computes its default)."""
  if option.flag:
    return Check(float, choices=(0.0, 1.0))
  if option.choices:
    return Check(str, choices=option.choices)
  return Check(float, low=option.low, high=None if math.isinf(option.high) else option.high,
               open_low=option.open, open_high=option.open, optional=option.default is None)


# A number as written on the command line (Python's float() also takes '1_000' and spaces).
_NUMBER = re.compile(r"[+-]?((\d+\.?\d*|\.\d+)(e[+-]?\d+)?|nan|inf|infinity)", re.IGNORECASE)


def _parse_one(item: str, check: Check):
  """The value of one item: 'auto' (None) where optional, a word of check.words, a string,
  or a number (an integer field takes integers, also written 1e3 or 3.0); ValueError else."""
  if check.optional and item == "auto":
    return None
  if item in check.words or check.kind is str:
    return item
  if not _NUMBER.fullmatch(item):
    raise ValueError(item)
  if check.kind is int:
    if re.fullmatch(r"[+-]?\d+", item):
      return int(item)
    number = float(item)
    if not number.is_integer():
      raise ValueError(item)
    return int(number)
  return float(item)


def key_check(config, key: str, option: str) -> Check:
  """The Check of key `key` of `option` (--set or --grid): that of config's field, or of
  an option config's algorithms declare (`option_check`); else a ConfigError listing the
  keys and those options."""
  known = fields(type(config))
  options = config.declared_options()
  if key in known:
    return known[key].metadata["check"]
  if key in options:
    return option_check(options[key])
  also = (f"; options of the algorithms in `algorithms`: {', '.join(sorted(options)) or 'none'}"
          f" (another algorithm's are keys once it is in `algorithms`)"
          if takes_options(config) else "")
  raise ConfigError(f"{option}: unknown configuration key {key!r}; valid keys: "
                    f"{', '.join(known)}{also}")


def _items(items) -> list[str]:
  """The --set or --grid items of `items`: a list of strings, or one string."""
  return [items] if isinstance(items, str) else list(items)


def _split(item: str, known: dict, option: str) -> tuple[str, str]:
  """(KEY, VALUE) of an `option` item 'KEY=VALUE' (KEY stripped of spaces, not empty)."""
  key, sep, text = item.partition("=")
  if not sep or not key.strip():
    raise ConfigError(f"{option} expects KEY=VALUE, got {item!r}; valid keys: {', '.join(known)}")
  return key.strip(), text


def _form(key: str, check: Check, option: str) -> str:
  """What to write after `option` KEY= (--set or --grid), as an instruction."""
  each = dataclasses.replace(check, sequence=False).describe()
  if option != "--set" or check.sequence:
    distinct = "distinct " if option != "--set" else ""
    return f"give one or more {distinct}values of {key}, each {each}, separated by single commas"
  return f"give one value of {key}: {each}"


def parse_values(key: str, text: str, check: Check, option: str = "--set"):
  """The value of `--set KEY=TEXT` (a tuple of its comma-separated items for a sequence
  field), or with option="--grid" (or "--sample") the tuple of the comma-separated values (items
  of a sequence field: each is one element). The grammar (docs/cli.md): items separated by
  single commas, spaces around an item ignored; no empty item (a leading, trailing or
  double comma), no '=' in TEXT, one item for a --set of a single-valued field."""
  several = check.sequence or option != "--set"
  each = dataclasses.replace(check, sequence=False)
  form = _form(key, check, option)
  items = [t.strip() for t in text.split(",")]
  if not text.strip():
    raise ConfigError(f"{option} {key}={text}: {form}")
  problem = None
  if "=" in text:
    problem = "a stray '=' in the value"
  elif "" in items:
    problem = ("a leading comma" if items[0] == "" else "a trailing comma" if items[-1] == ""
               else "an empty value between two commas")
  elif not several and len(items) > 1:
    problem = f"{key} takes one value, not {len(items)}"
    form += f", or sweep them with --grid {key}={','.join(items)}"
  if problem:
    raise ConfigError(f"{option} {key}={text}: {problem}; {form}")
  values = []
  for item in items:
    try:
      values.append(_parse_one(item, check))
    except (ValueError, OverflowError):
      raise ConfigError(f"{option} {key}={text}: {item!r} is not valid; {key} must be "
                        f"{(each if option != '--set' else check).describe()}") from None
  return tuple(values) if several else values[0]


def check_value(key: str, value, check: Check, option: str) -> None:
  """ConfigError (one line) unless `value` is one value of key `key` in `check`'s range."""
  each = dataclasses.replace(check, sequence=False)
  if not each.ok(value):
    raise ConfigError(f"{option}: {key}={value} is out of range; {key} must be "
                      f"{each.describe()}")


def override(config, items: typing.Sequence[str]):
  """`config` with each 'KEY=VALUE' of `items` (a string is one item) applied, parsed by the
  field's type (`parse_values`); a key given twice is a ConfigError."""
  known = fields(type(config))
  given, later = {}, {}
  for item in _items(items):
    key, text = _split(item, known, "--set")
    if key in given:
      sequence = key in known and known[key].metadata["check"].sequence
      raise ConfigError(f"{key} is given twice in --set ({given[key]} and {item}); give it "
                        f"once, as --set {key}={'V1,V2,...' if sequence else 'VALUE'}")
    given[key] = item
    if key not in known:  # an option: checked once the fields say which algorithms run
      later[key] = text
      continue
    config = dataclasses.replace(config, **{key: parse_values(key, text,
                                                         known[key].metadata["check"])})
  options = {key: parse_values(key, text, key_check(config, key, "--set"))
             for key, text in later.items()}
  return validate(with_options(config, options) if options else config)


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A checked grid (`sweep`), expanded once: `grid` {KEY: values} ({} without a grid),
  `samples` (points {KEY: value} drawn for keys given by range, `sampling`; () without),
  their `combinations` (each grid combination with each point; {KEY: value} dicts, the
  first key varying slowest; one empty dict without either), their `labels` ('KEY=VALUE,
  ...') and `configs` (the configuration with each combination applied)."""
  grid: dict
  combinations: tuple
  labels: tuple
  configs: tuple
  samples: tuple = ()

  @property
  def values(self) -> dict:
    """{KEY: the values tried} of every swept key: the grid's, and each sampled key's
    distinct values, ascending."""
    sampled = dict.fromkeys(k for point in self.samples for k in point)
    return {**self.grid, **{key: tuple(sorted({p[key] for p in self.samples}))
                            for key in sampled}}

  def split(self, traced_keys) -> tuple[list[dict] | None, list[dict]]:
    """(the combinations of the swept keys among `traced_keys` (the sampled keys, which
    must be among them, with each of their points), or None where none is swept; the
    combinations of the other swept keys, the shapes: [{}] where none is)."""
    traced = {key: values for key, values in self.grid.items() if key in traced_keys}
    shapes = {key: values for key, values in self.grid.items() if key not in traced}
    if not traced and not self.samples:
      return None, combinations(shapes)
    return _with_points(combinations(traced), self.samples), combinations(shapes)


def _with_points(every: list[dict], samples) -> list[dict]:
  """Each combination of `every` with each point of `samples` (`every` where none)."""
  return [{**c, **p} for c in every for p in samples] if samples else every


def sweep(config, grid, overrides: typing.Sequence[str] = (), samples=()) -> Sweep:
  """The sweep over `config`'s fields: every combination of `grid` with every point of
  `samples` ({KEY: value} dicts: candidates drawn from ranges, `sampling.draw`), checked.

  `grid` is {KEY: values} (Python) or 'KEY=V1,V2,...' items (--grid, parsed by the field's
  type; a string is one item); a sequence field sweeps single elements (each value becomes
  a one-element tuple, see `apply`). Unknown keys, a key repeated or also given in
  `overrides` (--set items), an empty or repeated value, and every combination whose
  configuration `validate` refuses are ConfigErrors, so the whole sweep is checked before
  any work.
  """
  known = fields(type(config))
  if isinstance(grid, typing.Mapping):
    entries = []
    for key, values in grid.items():
      if isinstance(values, str) or not isinstance(values, typing.Iterable):
        raise ConfigError(f"grid[{key!r}] = {values!r} is not a list of values; give a list, "
                          f"e.g. grid={{{key!r}: [V1, V2]}}")
      entries.append((key, tuple(values), ",".join(map(str, values))))
  else:
    entries = []
    for item in _items(grid):
      key, text = _split(item, known, "--grid")
      entries.append((key, parse_values(key, text, key_check(config, key, "--grid"), "--grid"),
                      text))
  fixed = {_split(item, known, "--set")[0] for item in _items(overrides)}
  swept = {}
  for key, values, text in entries:
    each = dataclasses.replace(key_check(config, key, "--grid"), sequence=False)
    if key in swept or key in fixed:
      where = "twice in --grid" if key in swept else "in both --set and --grid"
      raise ConfigError(f"{key} is given {where}; give all its values once, as "
                        f"--grid {key}=V1,V2,... (each {each.describe()})")
    form = _form(key, each, "--grid")
    if not values:
      raise ConfigError(f"--grid {key}=: {form}")
    twice = [v for i, v in enumerate(values) if v in values[:i]]
    if twice:
      raise ConfigError(f"--grid {key}={text}: {twice[0]} is given twice; {form}")
    swept[key] = values
  for key in dict.fromkeys(k for point in samples for k in point):
    if key in swept or key in fixed:
      raise ConfigError(f"{key} is given in --sample and in {'--grid' if key in swept else '--set'}"
                        f": give it once")
  every = _with_points(combinations(swept), tuple(samples))
  configs = tuple(apply(config, combination) for combination in every)
  for combination, each in zip(every, configs):
    try:
      validate(each)
    except ConfigError as error:
      raise ConfigError(f"--grid combination {combination_label(combination)}: {error}") from None
  return Sweep(swept, tuple(every), tuple(map(combination_label, every)), configs,
               tuple(samples))


def combinations(grid: dict[str, tuple]) -> list[dict]:
  """Every combination of the values of `grid` ({KEY: values}), as {KEY: value} dicts
  (the cartesian product, the first key varying slowest; [{}] for an empty grid)."""
  return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def setting_text(value) -> str:
  """A configuration value as --set writes it (sequences comma-separated, floats exact,
  None as auto)."""
  if isinstance(value, (list, tuple)):
    return ",".join(map(setting_text, value))
  if value is None:
    return "auto"
  return repr(value) if isinstance(value, float) else str(value)


def combination_label(combination: dict, sep: str = ", ") -> str:
  """'KEY=VALUE' of each key of `combination`, joined by `sep` (e.g. 'lr=0.3, num_clients=100')."""
  return sep.join(f"{key}={value}" for key, value in combination.items())


def apply(config, combination: dict):
  """`config` with the values of a grid `combination` (a sequence field gets a one-element
  tuple, an option goes into `options`); not validated (`sweep` validated every
  combination)."""
  known = fields(type(config))
  config = dataclasses.replace(config, **{
      key: (value,) if known[key].metadata["check"].sequence else value
      for key, value in combination.items() if key in known})
  options = {key: value for key, value in combination.items() if key not in known}
  return with_options(config, options) if options else config


def validate(config):
  """Returns `config` if every field is in its range (a list of choices names each once) and
  the cross-field rules hold."""
  for name, field in fields(type(config)).items():
    check, value = field.metadata["check"], vars(config)[name]
    values = value if check.sequence else (value,)
    if check.sequence and (not isinstance(value, tuple) or not value):
      raise ConfigError(f"{name} must be {check.describe()}, got {value!r}")
    for v in values:
      if not check.ok(v):
        raise ConfigError(f"{name}={v!r} is out of range: {name} must be {check.describe()}")
    if check.sequence and check.choices is not None and len(set(value)) < len(value):
      raise ConfigError(f"{name}={','.join(map(str, value))} names a choice twice: {name} must "
                        f"be {check.describe()}, each once")
  _validate_options(config)
  config.check()
  config.check_privacy()
  return config


def _validate_options(config) -> None:
  """ConfigError unless each of config's `options` is declared by its algorithms
  (`declared_options`) and in its Option's range."""
  declared = config.declared_options()
  for name, value in config.options:
    if name not in declared:
      raise ConfigError(f"{name} is an option that none of the configured algorithms "
                        f"declares; their options: {', '.join(sorted(declared)) or 'none'}; "
                        f"leave {name} out, or add an algorithm that declares it")
    try:
      declared[name].check(value)
    except ValueError as error:
      raise ConfigError(str(error)) from None


# Fields every recipe uses, under the names the command line documents (docs/cli.md).


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


@dataclasses.dataclass(frozen=True)
class Config:
  """The base of every recipe's configuration: where its clients run (`devices`,
  `cohort_groups`: `placement`, settings every recipe has), and the neutral answers to
  what shared code asks a configuration, which a recipe's configuration overrides where
  it has more to say.

  Class attributes (not fields): UNSHARDED, the algorithm (and why) where the recipe runs
  none that shards; SHARDED_ALGORITHMS, the names of its `algorithms` that shard
  (`shard_refusal`; a neural configuration asks the algorithms); `algorithms` and
  `options` (empty here) and `validation_fraction` (None: no validation split for
  --select), fields of the configurations that compare algorithms, take their traced
  options as keys or hold out validation data.
  """
  UNSHARDED = None
  SHARDED_ALGORITHMS = None
  algorithms = ()
  options = ()
  validation_fraction = None
  devices: int | str = setting(
      1, Check(int, low=1, words=("all",)),
      "devices the client axis is split over (all: every device JAX sees, those of every "
      "process of a job)", listed_last=True)
  cohort_groups: int | None = setting(
      None, Check(int, low=1, optional=True),
      "draw each round's cohort stratified over this many contiguous client groups (a "
      "multiple of devices): with it fixed, any device count gives the same numbers",
      listed_last=True)

  def check(self) -> None:
    """ConfigError unless the cross-field rules hold (none here)."""

  def private(self) -> bool:
    """Whether this configuration asks for user-level differential privacy (not here)."""
    return False

  def check_privacy(self) -> None:
    """ConfigError unless the differential-privacy settings hold (none here: no DP)."""

  def declared_options(self) -> dict:
    """{name: `nn.hparams.Option`} of the traced options this configuration takes as keys
    besides its fields (none here)."""
    return {}

  def shard_refusal(self, name: str) -> str | None:
    """None when this recipe's algorithm `name` can run sharded, else why not (here: unless
    it is one of SHARDED_ALGORITHMS)."""
    names = self.SHARDED_ALGORITHMS or ()
    if name in names:
      return None
    return f"of this recipe's algorithms only {', '.join(names)} shard" if names else (
        "this recipe's algorithms do not shard")

  def seed_values(self, seeds: int) -> list[int]:
    """The seeds of a run of `seeds` seeds: `seed`, `seed` + 1, ..."""
    return list(range(self.seed, self.seed + seeds))

  def code_record(self) -> dict:
    """What config.json records (under "code") of the kernel path that runs: XLA's."""
    return {"kernel": "xla"}

  def record(self, swept: Sweep) -> dict:
    """What config.json records of this configuration besides its fields (e.g. a neural
    recipe's resolved conventions), for it under the sweep `swept`: none here."""
    del swept
    return {}
