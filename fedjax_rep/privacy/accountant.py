"""User-level (epsilon, delta) accounting of a federated run with the Gaussian mechanism.

Every round the server draws a fixed-size cohort of `cohort` of the `num_clients` clients,
uniformly without replacement; each sampled client's update of the shared parameters is
clipped to L2 norm C, the server sums the clipped updates and adds Gaussian noise of std
noise * C per coordinate (noise * C / cohort on their average). Adjacent runs replace one
client's data (replace-one), so the sum's L2 sensitivity is 2C and dp-accounting's noise
multiplier (std / sensitivity) is noise / 2. The run is accounted as it samples: Google's
dp-accounting RDP accountant (REPLACE_ONE) composes `rounds` times a
SampledWithoutReplacementDpEvent(num_clients, cohort, GaussianDpEvent(noise / 2)); at
full participation (cohort == num_clients, q = 1) that event is the plain Gaussian's.
`calibrate` inverts it for the noise, `check` refuses out-of-range inputs in one line, and
`record` is what a run's config.json records. dp-accounting (the `privacy` extra) is
imported only by the functions that account, so a run without DP never imports it.
"""

import functools
import math
from importlib import metadata
import operator

MECHANISM = "gaussian, user-level, clipped updates of the shared parameters"
SAMPLING = "fixed-size cohort, uniformly without replacement (replace-one adjacency)"
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


def epsilon(noise: float, num_clients: int, cohort: int, rounds: int, delta: float) -> float:
  """The epsilon of (epsilon, delta)-DP, per client, that `rounds` rounds of the run spend.

  The RDP accountant (REPLACE_ONE) composes `rounds` times a
  SampledWithoutReplacementDpEvent(num_clients, cohort, GaussianDpEvent(noise / 2)).

  Args:
    noise: the noise multiplier (the std of the noise on the sum of clipped updates / C),
      >= 0; 0 (no noise) spends an infinite epsilon.
    num_clients: n, the clients the cohorts are drawn from (an integer >= 1).
    cohort: the clients drawn each round (an integer in [1, n]).
    rounds: the rounds run (an integer >= 0).
    delta: the delta, in (0, 1).

  Returns:
    epsilon (a float >= 0; inf for noise 0 and rounds > 0; 0 for rounds 0).
  """
  return epsilons(noise, num_clients, cohort, [rounds], delta)[0]


def epsilons(noise: float, num_clients: int, cohort: int, rounds_list, delta: float
             ) -> list[float]:
  """The epsilon spent after each number of rounds in `rounds_list` (one accountant).

  The same accounting as `epsilon`: each count composes, on the accountant of the counts
  before it, the rounds since the previous count.

  Args:
    noise: the noise multiplier, >= 0 (see `epsilon`).
    num_clients: n, the clients the cohorts are drawn from (an integer >= 1).
    cohort: the clients drawn each round (an integer in [1, n]).
    rounds_list: numbers of rounds (integers >= 0), in ascending order.
    delta: the delta, in (0, 1).

  Returns:
    [epsilon(noise, num_clients, cohort, r, delta) for r in rounds_list].
  """
  check(delta=delta, noise=noise)
  _sizes(num_clients, cohort)
  counts = [_integer("rounds", r, 0) for r in rounds_list]
  if any(b < a for a, b in zip(counts, counts[1:])):
    raise ValueError(f"rounds_list = {list(rounds_list)} is out of order: the numbers of "
                     "rounds must be ascending; sort them")
  event = _event(noise, num_clients, cohort) if noise > 0 else None
  if event is None:  # no noise: nothing is private after a round
    return [math.inf if r > 0 else 0.0 for r in counts]
  accountant, done, out = _accountant(), 0, []
  for r in counts:
    if r > done:
      accountant.compose(event, r - done)
      done = r
    out.append(float(accountant.get_epsilon(delta)))
  return out


@functools.lru_cache(maxsize=256)  # every program of a run asks it for the same setting
def calibrate(target_epsilon: float, num_clients: int, cohort: int, rounds: int,
              delta: float) -> float:
  """The noise multiplier at which `rounds` rounds of the run spend `target_epsilon`.

  dp_accounting.calibrate_dp_mechanism solves epsilon(noise) = target_epsilon (Brent's
  method) to a tolerance of RELATIVE_TOL of the noise, in a bracket that secant steps from
  noise 1 find (`_bracket`), and returns a noise on the private side: epsilon(calibrate(E))
  <= E, and within 1% of E where E is above the accountant's least positive epsilon (about
  log(1 / delta) / 1000, from its largest RDP order, 1024).

  Args:
    target_epsilon: E, the privacy budget, finite and > 0.
    num_clients: n, the clients the cohorts are drawn from (an integer >= 1).
    cohort: the clients drawn each round (an integer in [1, n]).
    rounds: the rounds run (an integer >= 1).
    delta: the delta, in (0, 1).

  Returns:
    The noise multiplier (noise std / C on the sum of clipped updates), a float > 0.

  Raises:
    ValueError: where MAX_STEPS secant steps find no bracket of the noise that spends E.
  """
  check(epsilon=target_epsilon, delta=delta)
  rounds = _integer("rounds", rounds, 1)
  dp = _dp_accounting()
  _sizes(num_clients, cohort)
  low, high = _bracket(lambda noise: epsilon(noise, num_clients, cohort, rounds, delta),
                       target_epsilon)
  return float(dp.calibrate_dp_mechanism(
      _accountant, lambda noise: dp.SelfComposedDpEvent(_event(noise, num_clients, cohort),
                                                        rounds),
      target_epsilon, delta, dp.ExplicitBracketInterval(low, high), tol=RELATIVE_TOL * low))


def record(noise: float, clip: float, delta: float, epsilon: float,
           calibrated: bool = False) -> dict:
  """What a run's config.json records of its differential privacy.

  Args:
    noise: the noise multiplier (noise std / clip on the sum of clipped updates).
    clip: C, the L2 norm each client's update is clipped to.
    delta: the delta of (epsilon, delta)-DP.
    epsilon: the epsilon the run spends (`epsilon(noise, ...)`).
    calibrated: whether the noise was calibrated to a target epsilon (`calibrate`).

  Returns:
    {"mechanism", "accountant" (with dp-accounting's version), "sampling",
    "noise_multiplier", "clip", "delta", "epsilon", "calibrated"}.
  """
  check(delta=delta, clip=clip, noise=noise)
  _dp_accounting()
  return {"mechanism": MECHANISM,
          "accountant": f"rdp (dp-accounting {metadata.version('dp-accounting')})",
          "sampling": SAMPLING,
          "noise_multiplier": float(noise), "clip": float(clip), "delta": float(delta),
          "epsilon": float(epsilon), "calibrated": bool(calibrated)}


def _accountant():
  """A fresh RDP accountant of the replace-one relation."""
  dp = _dp_accounting()
  return dp.rdp.RdpAccountant(neighboring_relation=dp.NeighboringRelation.REPLACE_ONE)


def _event(noise, num_clients, cohort):
  """One round's DpEvent: a cohort of `cohort` of `num_clients` drawn without replacement,
  then the Gaussian mechanism of noise multiplier noise / 2 (sensitivity 2C)."""
  n, c = _sizes(num_clients, cohort)
  dp = _dp_accounting()
  return dp.SampledWithoutReplacementDpEvent(
      source_dataset_size=n, sample_size=c, event=dp.GaussianDpEvent(noise / 2))


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
