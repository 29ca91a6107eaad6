"""fedjax_rep.privacy.accountant: its epsilon against dp-accounting's own RDP accounting of
the same mechanism (built here), calibration to a target epsilon, monotonicity, the one-line
input checks, and the lazy import of dp-accounting."""

import math
import subprocess
import sys

import dp_accounting
import pytest

from fedjax_rep.privacy import accountant

# (num_clients, cohort, noise, rounds, delta): q = cohort / num_clients from 0.02 to 1
# (full participation), noise multipliers from 0.7 to 8.
CASES = [(50, 5, 1.0, 100, 1e-3), (1000, 20, 0.7, 500, 1e-5), (200, 50, 8.0, 30, 1e-4),
         (10, 10, 3.0, 40, 1e-2), (1, 1, 2.0, 5, 0.5)]
N, COHORT, ROUNDS = 50, 5, 100


def reference_epsilon(num_clients, cohort, noise, rounds, delta):
  """dp-accounting's RDP epsilon of `rounds` rounds of a cohort of `cohort` out of
  `num_clients` drawn without replacement (replace-one), each the Gaussian sum of updates
  clipped to C with noise std noise * C (sensitivity 2C); full participation as the plain
  Gaussian."""
  gaussian = dp_accounting.GaussianDpEvent(noise_multiplier=noise / 2)
  event = gaussian if cohort == num_clients else dp_accounting.SampledWithoutReplacementDpEvent(
      source_dataset_size=num_clients, sample_size=cohort, event=gaussian)
  rdp = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  return rdp.compose(dp_accounting.SelfComposedDpEvent(event, rounds)).get_epsilon(delta)


@pytest.mark.parametrize("case", CASES)
def test_epsilon_is_dp_accountings_for_the_same_mechanism(case):
  num_clients, cohort, noise, rounds, delta = case
  expected = reference_epsilon(num_clients, cohort, noise, rounds, delta)
  assert 0 < expected < math.inf
  assert accountant.epsilon(noise, num_clients, cohort, rounds, delta) == pytest.approx(
      expected, rel=1e-12)


@pytest.mark.parametrize("case", [CASES[0], CASES[3]])
def test_epsilons_are_epsilon_at_each_count(case):
  num_clients, cohort, noise, rounds, delta = case
  counts = [0, 1, 1, 7, rounds]
  spent = accountant.epsilons(noise, num_clients, cohort, counts, delta)
  assert spent == pytest.approx(
      [accountant.epsilon(noise, num_clients, cohort, r, delta) for r in counts], rel=1e-9)
  assert spent[0] == 0.0


def test_no_noise_spends_an_infinite_epsilon():
  assert accountant.epsilon(0.0, N, COHORT, ROUNDS, 1e-3) == math.inf
  assert accountant.epsilons(0.0, N, COHORT, [0, 1, 10], 1e-3) == [0.0, math.inf, math.inf]


@pytest.mark.parametrize("target", [0.25, 0.5, 1.0, 2.0, 4.0])
def test_calibrate_spends_the_target_epsilon_within_1_percent(target):
  delta = accountant.default_delta(N)
  noise = accountant.calibrate(target, N, COHORT, ROUNDS, delta)
  spent = accountant.epsilon(noise, N, COHORT, ROUNDS, delta)
  assert 0.99 * target <= spent <= target


def test_calibrate_at_full_participation():
  noise = accountant.calibrate(1.0, 20, 20, 10, 1e-3)
  assert 0.99 <= reference_epsilon(20, 20, noise, 10, 1e-3) <= 1.0


def test_more_noise_spends_less_and_more_rounds_more():
  delta = accountant.default_delta(N)
  by_noise = [accountant.epsilon(noise, N, COHORT, ROUNDS, delta)
              for noise in (0.5, 1.0, 2.0, 4.0, 8.0)]
  assert all(a > b for a, b in zip(by_noise, by_noise[1:]))
  by_rounds = accountant.epsilons(1.0, N, COHORT, [1, 10, 100, 1000], delta)
  assert all(a < b for a, b in zip(by_rounds, by_rounds[1:]))


def test_default_delta_is_below_one_over_n():
  assert accountant.default_delta(50) == pytest.approx(50 ** -1.1)
  assert all(accountant.default_delta(n) < 1 / n for n in (2, 50, 10 ** 6))


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=0.0), r"^epsilon = 0\.0 is out of range: .*finite number > 0.*positive"),
    (dict(epsilon=-1), r"^epsilon = -1 is out of range"),
    (dict(epsilon=math.inf), r"^epsilon = inf is out of range"),
    (dict(epsilon=math.nan), r"^epsilon = nan is out of range"),
    (dict(delta=0.0), r"^delta = 0\.0 is out of range: it must be in \(0, 1\); give a delta"),
    (dict(delta=1.0), r"^delta = 1\.0 is out of range"),
    (dict(delta=math.nan), r"^delta = nan is out of range"),
    (dict(clip=0.0), r"^clip = 0\.0 is out of range: .*finite number > 0; give a positive"),
    (dict(clip=-2.0), r"^clip = -2\.0 is out of range"),
    (dict(clip=math.inf), r"^clip = inf is out of range"),
    (dict(noise=-0.5), r"^noise = -0\.5 is out of range: .*finite number >= 0; give a noise"),
    (dict(noise=math.inf), r"^noise = inf is out of range"),
    (dict(noise=math.nan), r"^noise = nan is out of range"),
])
def test_check_refuses_out_of_range_inputs_in_one_line(kwargs, match):
  with pytest.raises(ValueError, match=match) as error:
    accountant.check(**kwargs)
  assert "\n" not in str(error.value)


def test_check_accepts_inputs_in_range_and_none():
  accountant.check()
  accountant.check(epsilon=1e-3, delta=1e-9, clip=0.1, noise=0.0)


@pytest.mark.parametrize("call, match", [
    (lambda: accountant.epsilon(1.0, 10, 11, 5, 1e-3), r"^cohort = 11 is out of range"),
    (lambda: accountant.epsilon(1.0, 0, 1, 5, 1e-3), r"^num_clients = 0 is out of range"),
    (lambda: accountant.epsilon(1.0, 10, 2, -1, 1e-3), r"^rounds = -1 is out of range"),
    (lambda: accountant.epsilon(1.0, 10, 2, 2.5, 1e-3), r"^rounds = 2\.5 is out of range"),
    (lambda: accountant.epsilon(1.0, 10, 2, 5, 2.0), r"^delta = 2\.0 is out of range"),
    (lambda: accountant.epsilons(1.0, 10, 2, [5, 3], 1e-3), r"out of order"),
    (lambda: accountant.calibrate(-1.0, 10, 2, 5, 1e-3), r"^epsilon = -1\.0 is out of range"),
    (lambda: accountant.calibrate(1.0, 10, 2, 0, 1e-3), r"^rounds = 0 is out of range"),
])
def test_accounting_refuses_out_of_range_arguments(call, match):
  with pytest.raises(ValueError, match=match) as error:
    call()
  assert "\n" not in str(error.value)


def test_record_is_what_config_json_records():
  record = accountant.record(noise=1.5, clip=0.5, delta=1e-3, epsilon=2.0, calibrated=True)
  assert record == {
      "mechanism": "gaussian, user-level, clipped updates of the shared parameters",
      "accountant": f"rdp (dp-accounting {dp_accounting_version()})",
      "sampling": "fixed-size cohort, uniformly without replacement (replace-one adjacency)",
      "noise_multiplier": 1.5, "clip": 0.5, "delta": 1e-3, "epsilon": 2.0,
      "calibrated": True}


def dp_accounting_version():
  from importlib import metadata
  return metadata.version("dp-accounting")


def test_importing_the_accountant_does_not_import_dp_accounting():
  code = ("import sys, fedjax_rep.privacy.accountant as a; a.check(epsilon=1.0, delta=0.1); "
          "a.default_delta(10); print('dp_accounting' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True)
  assert out.stdout.strip() == "False"


def test_missing_dp_accounting_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "dp_accounting", None)  # `import dp_accounting` fails
  with pytest.raises(ImportError) as error:
    accountant.epsilon(1.0, N, COHORT, ROUNDS, 1e-3)
  assert str(error.value) == ("differential privacy needs dp-accounting: pip install "
                              "'.[privacy]' (or pip install dp-accounting)")
