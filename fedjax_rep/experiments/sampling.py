"""Candidate settings drawn from ranges (`fedjax-rep run ... --sample KEY=DIST --trials N`).

A distribution is 'loguniform:LOW:HIGH' (0 < LOW < HIGH), 'uniform:LOW:HIGH', 'int:LOW:HIGH'
(integers LOW..HIGH, both included) or 'choice:V1,V2,...'. The N points are the first N of
a scrambled Sobol sequence (`scipy.stats.qmc.Sobol`, scrambled from the run's seed), one
coordinate per sampled key, mapped through each key's distribution: a quasi-random design
covers the space more evenly than N independent draws (no two trials crowd one corner
while another stays empty), and the same seed gives the same points. Its balance is exact
where N is a power of 2. Floats are rounded to 4 significant digits, the precision at
which a setting is read, so that labels stay short.
"""

import dataclasses
import math

import numpy as np

from fedjax_rep.experiments import config as cfg

KINDS = ("loguniform", "uniform", "int", "choice")
FORM = ("loguniform:LOW:HIGH (0 < LOW < HIGH), uniform:LOW:HIGH, int:LOW:HIGH (integers, "
        "both ends included) or choice:V1,V2,...")
DESIGN = ("the first N points of a scrambled Sobol sequence (scipy.stats.qmc.Sobol), "
          "scrambled from the run's seed")
SEED_TAG = 0x73616D70  # the Sobol scrambling's stream: rng((seed, SEED_TAG))


@dataclasses.dataclass(frozen=True)
class Distribution:
  """A key's range: kind (KINDS), low and high (the numeric kinds), choices ('choice')."""
  kind: str
  low: float = 0.0
  high: float = 0.0
  choices: tuple = ()

  def value(self, u: float):
    """The value at quantile u in [0, 1)."""
    if self.kind == "choice":
      return self.choices[min(int(u * len(self.choices)), len(self.choices) - 1)]
    if self.kind == "int":
      return int(min(self.low + math.floor(u * (self.high - self.low + 1)), self.high))
    if self.kind == "loguniform":
      x = math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
    else:
      x = self.low + u * (self.high - self.low)
    return float(f"{x:.4g}")

  def text(self) -> str:
    """The distribution as --sample writes it, e.g. 'loguniform:0.003:0.3'."""
    if self.kind == "choice":
      return "choice:" + ",".join(map(str, self.choices))
    number = (lambda x: str(int(x))) if self.kind == "int" else (lambda x: f"{x:g}")
    return f"{self.kind}:{number(self.low)}:{number(self.high)}"


def parse(config, item: str) -> tuple[str, Distribution]:
  """(KEY, Distribution) of a --sample item 'KEY=DIST'; ConfigError (one line) where KEY is
  not a key of `config` or DIST not one of FORM, or its values out of the key's range."""
  key, sep, text = item.partition("=")
  key = key.strip()
  if not sep or not key:
    raise cfg.ConfigError(f"--sample {item!r}: give KEY=DIST, DIST one of {FORM}")
  check = cfg.key_check(config, key, "--sample")
  kind, _, rest = text.partition(":")
  where = f"--sample {key}={text}"
  if kind not in KINDS:
    raise cfg.ConfigError(f"{where}: {kind!r} is not a distribution; give one of {FORM}")
  if kind == "choice":
    values = cfg.parse_values(key, rest, check, "--sample")
    if len(values) < 2:
      raise cfg.ConfigError(f"{where}: a choice needs two values or more, e.g. "
                            f"choice:V1,V2")
    return key, Distribution(kind, choices=values)
  bounds = rest.split(":")
  try:
    low, high = (float(b) for b in bounds) if len(bounds) == 2 else (None, None)
  except ValueError:
    low = high = None
  if low is None or not (math.isfinite(low) and math.isfinite(high)) or not low < high:
    raise cfg.ConfigError(f"{where}: give {kind}:LOW:HIGH with numbers LOW < HIGH")
  if kind == "loguniform" and not low > 0:
    raise cfg.ConfigError(f"{where}: a log-uniform range needs 0 < LOW, got LOW={low:g}")
  if kind == "int" and not (low.is_integer() and high.is_integer()):
    raise cfg.ConfigError(f"{where}: an integer range needs integer ends")
  for end in (low, high):
    cfg.check_value(key, int(end) if kind == "int" else end, check, where)
  return key, Distribution(kind, low, high)


def draw(distributions: dict[str, Distribution], trials: int, seed: int) -> list[dict]:
  """`trials` points {KEY: value} of `distributions` (`parse`): the first `trials` of a
  Sobol sequence in as many dimensions, scrambled from `seed`, each coordinate through its
  key's distribution."""
  from scipy.stats import qmc  # a large import, which runs without --sample skip
  sobol = qmc.Sobol(len(distributions), scramble=True,
                    rng=np.random.default_rng((seed, SEED_TAG)))
  points = sobol.random_base2(max(0, math.ceil(math.log2(trials))))[:trials]
  return [{key: d.value(float(u)) for (key, d), u in zip(distributions.items(), point)}
          for point in points]


def check_trials(trials, sampled: bool) -> None:
  """ConfigError (one line) unless `trials` is an integer >= 2 given with --sample keys
  (`sampled`), or None without."""
  if trials is None:
    if sampled:
      raise cfg.ConfigError("--sample draws --trials N candidates: give --trials, e.g. "
                            "--trials 27")
    return
  if not sampled:
    raise cfg.ConfigError("--trials is the number of candidates --sample draws: give "
                          "--sample KEY=DIST too")
  if isinstance(trials, bool) or not isinstance(trials, int) or trials < 2:
    raise cfg.ConfigError(f"--trials must be an integer >= 2, got {trials!r}")
