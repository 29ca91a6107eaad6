"""User-level (epsilon, delta) accounting of a federated run with the Gaussian mechanism.

Each sampled client's update of the shared parameters is clipped to L2 norm C, the server
sums them and adds Gaussian noise of std noise * C per coordinate. The run is accounted as
it samples (`sampling`), by Google's dp-accounting: "cohort" draws a fixed-size cohort of
`cohort` of the `num_clients` clients without replacement (replace-one: sensitivity 2C),
a SampledWithoutReplacementDpEvent only the RDP accountant accounts, or at full
participation (cohort == num_clients) the plain Gaussian, which PLD accounts tighter;
"poisson" takes each client with probability cohort / num_clients, truncated to `cohort`
(add-or-remove-one: sensitivity C), a TruncatedSubsampledGaussianDpEvent only the PLD
accountant accounts. `accountant_for` resolves the accountant, `calibrate` inverts epsilon
for the noise, `check` refuses out-of-range inputs in one line, and `record` is what a
run's config.json records. dp-accounting (the `privacy` extra) is imported only by the
functions that account, so a run without DP never imports it.
"""

import functools
import math
from importlib import metadata
import operator

MECHANISM = "gaussian, user-level, clipped updates of the shared parameters"
SAMPLINGS = ("cohort", "poisson")
ACCOUNTANTS = ("pld", "rdp")
# what `record` writes of each sampling
SAMPLING_RECORD = {
    "cohort": "fixed-size cohort, uniformly without replacement (replace-one adjacency)",
    "poisson": ("Poisson, each client with probability cohort / n, truncated to cohort "
                "(add-or-remove-one adjacency)")}
MISSING = ("differential privacy needs dp-accounting: pip install '.[privacy]' "
           "(or pip install dp-accounting)")
# calibrate's bracket (`_bracket`): at most MAX_STEPS secant steps, each a factor
# 1 + OVERSHOOT past the root it predicts; brentq (in calibrate_dp_mechanism) then solves in
# the bracket to a tolerance RELATIVE_TOL of the noise.
MAX_STEPS, OVERSHOOT, RELATIVE_TOL = 60, 2e-3, 1e-4


def _dp_accounting():
  """The dp_accounting module, imported on first use.

  Returns:
    The module `dp_accounting`.

  Raises:
    ImportError: in one line, saying how to install it, where it is not installed.
  """
  try:
    import dp_accounting
  except ImportError:
    raise ImportError(MISSING) from None
  return dp_accounting


def default_delta(num_clients: int) -> float:
  """The delta a run uses unless given one: 1 / num_clients**1.1.

  The rule keeps delta below 1 / n, the probability of a mechanism that publishes one
  client's data at random, as (epsilon, delta)-DP requires of a meaningful delta.

  Args:
    num_clients: n, the clients of the run (an integer >= 1).

  Returns:
    1 / n**1.1.
  """
  n = _integer("num_clients", num_clients, 1)
  return 1.0 / n ** 1.1


def check(epsilon=None, delta=None, clip=None, noise=None) -> None:
  """Refuses a privacy input out of range, with a one-line ValueError; None: not given.

  Args:
    epsilon: the privacy budget, finite and > 0.
    delta: the delta of (epsilon, delta)-DP, in (0, 1).
    clip: C, the L2 norm each client's update is clipped to, finite and > 0.
    noise: the noise multiplier (noise std / C on the sum of updates), finite and >= 0.

  Returns:
    None.

  Raises:
    ValueError: naming the argument at fault, its range and what to do.
  """
  if epsilon is not None and not (_finite(epsilon) and epsilon > 0):
    raise ValueError(f"epsilon = {epsilon!r} is out of range: the privacy budget must be a "
                     "finite number > 0; give a positive epsilon (e.g. 1.0), or no epsilon "
                     "for a run without differential privacy")
  if delta is not None and not (_finite(delta) and 0 < delta < 1):
    raise ValueError(f"delta = {delta!r} is out of range: it must be in (0, 1); give a delta "
                     "below 1 / num_clients (default_delta(num_clients) = 1 / n**1.1), "
                     "or none for that default")
  if clip is not None and not (_finite(clip) and clip > 0):
    raise ValueError(f"clip = {clip!r} is out of range: the L2 norm the clients' updates "
                     "are clipped to must be a finite number > 0; give a positive clip "
                     "(e.g. 1.0)")
  if noise is not None and not (_finite(noise) and noise >= 0):
    raise ValueError(f"noise = {noise!r} is out of range: the noise multiplier (noise std / "
                     "clip) must be a finite number >= 0; give a noise >= 0, or an epsilon "
                     "to calibrate it")


def accountant_for(sampling: str, num_clients: int, cohort: int,
                   accountant: str | None = None) -> str:
  """The accountant that accounts `sampling` of `cohort` of `num_clients` clients a round.

  `accountant` where given and able; else (None) "pld" wherever dp-accounting's PLD
  accounts the sampling ("poisson"; or "cohort" at full participation, cohort ==
  num_clients), else "rdp" (a fixed-size cohort < num_clients, which only RDP accounts).

  Args:
    sampling: "cohort" or "poisson" (SAMPLINGS).
    num_clients: n, the clients sampled from (an integer >= 1).
    cohort: the clients a round trains (an integer in [1, n]; < n for "poisson").
    accountant: "pld", "rdp" (ACCOUNTANTS) or None (resolved as above).

  Returns:
    "pld" or "rdp".

  Raises:
    ValueError: in one line, naming the argument at fault, why and what to do: an unknown
      sampling or accountant; "pld" for a cohort < n under "cohort"; "rdp" under
      "poisson"; "poisson" at cohort == num_clients.
  """
  _names(sampling, accountant)
  n, c = _sizes(num_clients, cohort)
  if sampling == "poisson" and c == n:
    raise ValueError(f"sampling = 'poisson' is out of range at cohort = num_clients = {n}: "
                     "at full participation (probability 1) every client trains every "
                     "round; use sampling='cohort'")
  if sampling == "cohort" and c < n and accountant == "pld":
    raise ValueError(f"accountant = 'pld' cannot account sampling='cohort' with cohort = {c} "
                     f"< num_clients = {n}: dp-accounting's PLD has no fixed-size sampling "
                     "without replacement; use accountant='rdp' (or None), or "
                     "sampling='poisson'")
  if accountant is not None:
    return accountant
  return "pld" if sampling == "poisson" or c == n else "rdp"


def epsilon(noise: float, num_clients: int, cohort: int, rounds: int, delta: float,
            sampling: str = "cohort", accountant: str | None = None) -> float:
  """The epsilon of (epsilon, delta)-DP, per client, that `rounds` rounds of the run spend.

  The accountant (`accountant_for`) composes `rounds` times one round's DpEvent (`_event`):
  "cohort", cohort < num_clients: SampledWithoutReplacementDpEvent(num_clients, cohort,
  GaussianDpEvent(noise / 2)) on RDP (REPLACE_ONE); "cohort", cohort == num_clients: the
  Gaussian alone, GaussianDpEvent(noise) on PLD (REPLACE_ONE) or GaussianDpEvent(noise / 2)
  on RDP, both the Gaussian of sensitivity 2C; "poisson":
  TruncatedSubsampledGaussianDpEvent(num_clients, cohort / num_clients, cohort, noise) on
  PLD (ADD_OR_REMOVE_ONE).

  Args:
    noise: the noise multiplier (the std of the noise on the sum of clipped updates / C),
      >= 0; 0 (no noise) spends an infinite epsilon.
    num_clients: n, the clients sampled from (an integer >= 1).
    cohort: the clients a round trains (an integer in [1, n]).
    rounds: the rounds run (an integer >= 0).
    delta: the delta, in (0, 1).
    sampling: "cohort" (default) or "poisson".
    accountant: "pld", "rdp" or None (`accountant_for`'s choice).

  Returns:
    epsilon (a float >= 0; inf for noise 0 and rounds > 0; 0 for rounds 0).

  Raises:
    ValueError: in one line, for an input out of range or a sampling the accountant cannot
      account (`accountant_for`).
  """
  return epsilons(noise, num_clients, cohort, [rounds], delta, sampling, accountant)[0]


def epsilons(noise: float, num_clients: int, cohort: int, rounds_list, delta: float,
             sampling: str = "cohort", accountant: str | None = None) -> list[float]:
  """The epsilon spent after each number of rounds in `rounds_list` (one accountant).

  The same accounting as `epsilon`: each count composes, on the accountant of the counts
  before it, the rounds since the previous count.

  Args:
    noise: the noise multiplier, >= 0 (see `epsilon`).
    num_clients: n, the clients sampled from (an integer >= 1).
    cohort: the clients a round trains (an integer in [1, n]).
    rounds_list: numbers of rounds (integers >= 0), in ascending order.
    delta: the delta, in (0, 1).
    sampling: "cohort" (default) or "poisson".
    accountant: "pld", "rdp" or None (`accountant_for`'s choice).

  Returns:
    [epsilon(noise, num_clients, cohort, r, delta, sampling, accountant)
     for r in rounds_list].
  """
  check(delta=delta, noise=noise)
  name = accountant_for(sampling, num_clients, cohort, accountant)
  counts = [_integer("rounds", r, 0) for r in rounds_list]
  if any(b < a for a, b in zip(counts, counts[1:])):
    raise ValueError(f"rounds_list = {list(rounds_list)} is out of order: the numbers of "
                     "rounds must be ascending; sort them")
  if noise == 0:  # no noise: nothing is private after a round
    return [math.inf if r > 0 else 0.0 for r in counts]
  event = _event(noise, num_clients, cohort, sampling, name)
  spent, done, out = _accountant(name, sampling), 0, []
  for r in counts:
    if r > done:
      spent.compose(event, r - done)
      done = r
    out.append(float(spent.get_epsilon(delta)))
  return out


@functools.lru_cache(maxsize=256)  # every program of a run asks it for the same setting
def calibrate(target_epsilon: float, num_clients: int, cohort: int, rounds: int,
              delta: float, sampling: str = "cohort", accountant: str | None = None
              ) -> float:
  """The noise multiplier at which `rounds` rounds of the run spend `target_epsilon`.

  dp_accounting.calibrate_dp_mechanism solves epsilon(noise) = target_epsilon (Brent's
  method), on the accountant and events of `epsilon`, to a tolerance of RELATIVE_TOL of the
  noise, in a bracket that secant steps from noise 1 find (`_bracket`), and returns a
  noise on the private side: epsilon(calibrate(E)) <= E, and within 1% of E where E is
  above the accountant's least positive epsilon (for RDP about log(1 / delta) / 1000, from
  its largest order, 1024).

  Args:
    target_epsilon: E, the privacy budget, finite and > 0.
    num_clients: n, the clients sampled from (an integer >= 1).
    cohort: the clients a round trains (an integer in [1, n]).
    rounds: the rounds run (an integer >= 1).
    delta: the delta, in (0, 1).
    sampling: "cohort" (default) or "poisson".
    accountant: "pld", "rdp" or None (`accountant_for`'s choice).

  Returns:
    The noise multiplier (noise std / C on the sum of clipped updates), a float > 0.

  Raises:
    ValueError: where MAX_STEPS secant steps find no bracket of the noise that spends E;
      in one line, for an input out of range or a sampling the accountant cannot account.
  """
  check(epsilon=target_epsilon, delta=delta)
  rounds = _integer("rounds", rounds, 1)
  name = accountant_for(sampling, num_clients, cohort, accountant)
  dp = _dp_accounting()
  low, high = _bracket(
      lambda noise: epsilon(noise, num_clients, cohort, rounds, delta, sampling, name),
      target_epsilon)
  return float(dp.calibrate_dp_mechanism(
      lambda: _accountant(name, sampling),
      lambda noise: dp.SelfComposedDpEvent(
          _event(noise, num_clients, cohort, sampling, name), rounds),
      target_epsilon, delta, dp.ExplicitBracketInterval(low, high), tol=RELATIVE_TOL * low))


def record(noise: float, clip: float, delta: float, epsilon: float,
           calibrated: bool = False, sampling: str = "cohort",
           accountant: str | None = None, num_clients: int | None = None,
           cohort: int | None = None) -> dict:
  """What a run's config.json records of its differential privacy.

  Args:
    noise: the noise multiplier (noise std / clip on the sum of clipped updates).
    clip: C, the L2 norm each client's update is clipped to.
    delta: the delta of (epsilon, delta)-DP.
    epsilon: the epsilon the run spends (`epsilon(noise, ...)`).
    calibrated: whether the noise was calibrated to a target epsilon (`calibrate`).
    sampling: "cohort" (default) or "poisson".
    accountant: "pld", "rdp" or None: `accountant_for(sampling, num_clients, cohort)`,
      which needs num_clients and cohort; without them the accountant must be given.
    num_clients: n, the clients sampled from, or None (then cohort is None too).
    cohort: the clients a round trains, or None (then num_clients is None too).

  Returns:
    {"mechanism", "accountant" (the accountant, with dp-accounting's version), "sampling"
    (SAMPLING_RECORD[sampling]), "noise_multiplier", "clip", "delta", "epsilon",
    "calibrated"}, and "sampling_rate" (cohort / num_clients, in (0, 1]) where num_clients
    and cohort are given.

  Raises:
    ValueError: in one line, for an input out of range, a sampling the accountant cannot
      account, only one of num_clients and cohort, or neither with accountant None.
  """
  check(delta=delta, clip=clip, noise=noise)
  if (num_clients is None) != (cohort is None):
    raise ValueError(f"num_clients = {num_clients!r} and cohort = {cohort!r} go together: "
                     "give both (to resolve the accountant and record the sampling rate) "
                     "or neither")
  if num_clients is None:
    _names(sampling, accountant)
    if accountant is None:
      raise ValueError("accountant = None cannot be resolved without num_clients and "
                       "cohort: give num_clients and cohort, or accountant='pld' or 'rdp'")
    name, rate = accountant, {}
  else:
    name = accountant_for(sampling, num_clients, cohort, accountant)
    rate = {"sampling_rate": cohort / num_clients}
  _dp_accounting()
  return {"mechanism": MECHANISM,
          "accountant": f"{name} (dp-accounting {metadata.version('dp-accounting')})",
          "sampling": SAMPLING_RECORD[sampling],
          "noise_multiplier": float(noise), "clip": float(clip), "delta": float(delta),
          "epsilon": float(epsilon), "calibrated": bool(calibrated), **rate}


def _names(sampling, accountant):
  """Refuses an unknown sampling or accountant, or RDP for Poisson, in one line."""
  if sampling not in SAMPLINGS:
    raise ValueError(f"sampling = {sampling!r} is unknown: it must be one of {SAMPLINGS}; "
                     "give sampling='cohort' (a fixed-size cohort) or 'poisson'")
  if accountant is not None and accountant not in ACCOUNTANTS:
    raise ValueError(f"accountant = {accountant!r} is unknown: it must be one of "
                     f"{ACCOUNTANTS} or None; give accountant='pld', 'rdp' or None (the "
                     "accountant that accounts the sampling)")
  if sampling == "poisson" and accountant == "rdp":
    raise ValueError("accountant = 'rdp' cannot account sampling='poisson': dp-accounting's "
                     "RDP has no truncated-Poisson event; use accountant='pld' (or None)")


def _accountant(name, sampling):
  """A fresh accountant `name` ("pld" or "rdp") of `sampling`'s neighbouring relation
  (REPLACE_ONE for "cohort", ADD_OR_REMOVE_ONE for "poisson")."""
  dp = _dp_accounting()
  relation = (dp.NeighboringRelation.ADD_OR_REMOVE_ONE if sampling == "poisson"
              else dp.NeighboringRelation.REPLACE_ONE)
  if name == "pld":
    return dp.pld.PLDAccountant(relation)
  return dp.rdp.RdpAccountant(neighboring_relation=relation)


def _event(noise, num_clients, cohort, sampling, name):
  """One round's DpEvent of noise multiplier `noise` (> 0) for accountant `name`.

  "poisson": the truncated Poisson-subsampled Gaussian (sensitivity C, multiplier noise).
  "cohort": the cohort drawn without replacement, then the Gaussian of sensitivity 2C; at
  full participation the Gaussian alone. RDP's Gaussian has sensitivity 1, so its
  multiplier is noise / 2; PLD's REPLACE_ONE Gaussian already shifts by twice its
  sensitivity (from -1 to +1), so its multiplier is noise."""
  n, c = _sizes(num_clients, cohort)
  dp = _dp_accounting()
  if sampling == "poisson":
    return dp.TruncatedSubsampledGaussianDpEvent(
        dataset_size=n, sampling_probability=c / n, truncated_batch_size=c,
        noise_multiplier=noise)
  gaussian = dp.GaussianDpEvent(noise if name == "pld" else noise / 2)
  if c == n:
    return gaussian
  return dp.SampledWithoutReplacementDpEvent(
      source_dataset_size=n, sample_size=c, event=gaussian)


def _sizes(num_clients, cohort):
  """(num_clients, cohort) as ints, 1 <= cohort <= num_clients, or a one-line ValueError."""
  n = _integer("num_clients", num_clients, 1)
  c = _integer("cohort", cohort, 1)
  if c > n:
    raise ValueError(f"cohort = {cohort!r} is out of range: it must be in [1, num_clients = "
                     f"{n}]; draw at most num_clients clients a round")
  return n, c


def _bracket(spent, target):
  """(low, high): noises with spent(low) > target >= spent(high), a factor at most
  1 + 4 OVERSHOOT apart.

  Secant steps on log epsilon against log noise (epsilon ~ noise**-k, k in [1, 2]) from
  noise 1, each landing a factor 1 + OVERSHOOT beyond the root the secant predicts, so
  that the steps come to straddle the root; the nearest noises on either side."""
  low = high = previous = None
  noise = 1.0
  for _ in range(MAX_STEPS):
    value = spent(noise)
    if value > target:
      low = noise if low is None else max(low, noise)
    else:
      high = noise if high is None else min(high, noise)
    if low is not None and high is not None and high <= low * (1 + 4 * OVERSHOOT):
      return low, high
    slope = 1.5
    if previous is not None and min(previous[1], value) > 0 and previous[0] != noise:
      slope = -math.log(value / previous[1]) / math.log(noise / previous[0])
      slope = slope if 0.5 <= slope <= 4 else 1.5
    previous = noise, value
    ratio = max(value, target * 2.0 ** -10) / target
    root = noise * min(max(ratio ** (1 / slope), 2.0 ** -10), 2.0 ** 10)
    noise = root * (1 + OVERSHOOT) if value > target else root / (1 + OVERSHOOT)
    if low is not None and high is not None and not low < noise < high:
      noise = math.sqrt(low * high)  # a secant step out of the bracket: bisect it
  raise ValueError(f"target_epsilon = {target} is out of reach: no noise multiplier between "
                   f"{low} and {high} spends it; give another target_epsilon or delta")


def _integer(name, value, low):
  """`value` as an int >= low, or a one-line ValueError naming `name`."""
  try:
    number = operator.index(value)
  except TypeError:
    number = None
  if number is None or number < low:
    raise ValueError(f"{name} = {value!r} is out of range: it must be an integer >= {low}; "
                     f"give a whole number >= {low}")
  return number


def _finite(value) -> bool:
  """Whether `value` is a finite real number."""
  try:
    return math.isfinite(value)
  except TypeError:
    return False
