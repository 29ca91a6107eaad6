"""fedjax_rep.privacy.accountant: its epsilon against dp-accounting's own RDP and PLD
accounting of the same mechanism (built here) under each sampling, the accountant each
sampling resolves to and the ones it refuses, calibration to a target epsilon,
monotonicity, the one-line input checks, and the lazy import of dp-accounting."""

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
  assert accountant.epsilon(noise, num_clients, cohort, rounds, delta,
                            accountant="rdp") == pytest.approx(expected, rel=1e-12)


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
  noise = accountant.calibrate(1.0, 20, 20, 10, 1e-3, accountant="rdp")
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
  record = accountant.record(noise=1.5, clip=0.5, delta=1e-3, epsilon=2.0, calibrated=True,
                             accountant="rdp")
  assert record == {
      "mechanism": "gaussian, user-level, clipped updates of the shared parameters",
      "accountant": f"rdp (dp-accounting {dp_accounting_version()})",
      "sampling": "fixed-size cohort, uniformly without replacement (replace-one adjacency)",
      "noise_multiplier": 1.5, "clip": 0.5, "delta": 1e-3, "epsilon": 2.0,
      "calibrated": True}


def test_record_of_each_sampling_names_its_accountant_and_sampling_rate():
  version = dp_accounting_version()
  poisson = accountant.record(noise=2.0, clip=1.0, delta=1e-3, epsilon=1.0,
                              sampling="poisson", num_clients=200, cohort=20)
  assert poisson["accountant"] == f"pld (dp-accounting {version})"
  assert poisson["sampling"] == ("Poisson, each client with probability cohort / n, "
                                 "truncated to cohort (add-or-remove-one adjacency)")
  assert poisson["sampling_rate"] == 0.1
  full = accountant.record(noise=2.0, clip=1.0, delta=1e-3, epsilon=1.0, num_clients=20,
                           cohort=20)
  assert full["accountant"] == f"pld (dp-accounting {version})"
  assert full["sampling"] == accountant.SAMPLING_RECORD["cohort"] and full["sampling_rate"] == 1
  fixed = accountant.record(noise=2.0, clip=1.0, delta=1e-3, epsilon=1.0, num_clients=50,
                            cohort=5)
  assert fixed["accountant"] == f"rdp (dp-accounting {version})"
  assert fixed["sampling_rate"] == 0.1
  assert set(fixed) == {"mechanism", "accountant", "sampling", "noise_multiplier", "clip",
                        "delta", "epsilon", "calibrated", "sampling_rate"}


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


# Each sampling with each accountant that accounts it: (sampling, accountant,
# (num_clients, cohort, noise, rounds, delta)); None is the accountant it resolves to.
ACCOUNTED = [
    ("cohort", "rdp", (50, 5, 1.0, 100, 1e-3)), ("cohort", None, (200, 50, 8.0, 30, 1e-4)),
    ("cohort", "pld", (10, 10, 8.0, 20, 1e-2)), ("cohort", None, (20, 20, 4.0, 5, 1e-3)),
    ("cohort", "rdp", (10, 10, 3.0, 40, 1e-2)), ("cohort", "rdp", (1, 1, 2.0, 5, 0.5)),
    ("poisson", "pld", (100, 10, 4.0, 20, 1e-3)), ("poisson", None, (50, 20, 5.0, 50, 1e-2)),
    ("poisson", "pld", (200, 20, 3.0, 30, 200 ** -1.1))]


def reference_epsilons(sampling, name, num_clients, cohort, noise, rounds, delta):
  """dp-accounting's epsilon of `rounds` rounds under `sampling` with accountant `name`:
  Poisson sampling truncated to `cohort`, the Gaussian of sensitivity C (add-or-remove-one)
  on PLD; a cohort at full participation on PLD, whose REPLACE_ONE Gaussian of multiplier
  noise is the shift from -C to +C (sensitivity 2C) under noise std noise * C; else RDP."""
  if name == "rdp":
    return reference_epsilon(num_clients, cohort, noise, rounds, delta)
  if sampling == "poisson":
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    event = dp_accounting.TruncatedSubsampledGaussianDpEvent(
        dataset_size=num_clients, sampling_probability=cohort / num_clients,
        truncated_batch_size=cohort, noise_multiplier=noise)
  else:
    assert cohort == num_clients
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
    event = dp_accounting.GaussianDpEvent(noise_multiplier=noise)
  pld = dp_accounting.pld.PLDAccountant(relation)
  return pld.compose(dp_accounting.SelfComposedDpEvent(event, rounds)).get_epsilon(delta)


@pytest.mark.parametrize("sampling, name, case", ACCOUNTED)
def test_each_sampling_is_dp_accountings_accounting_of_it(sampling, name, case):
  num_clients, cohort, noise, rounds, delta = case
  resolved = accountant.accountant_for(sampling, num_clients, cohort, name)
  assert resolved == name or name is None
  expected = reference_epsilons(sampling, resolved, *case)
  assert 0 < expected < math.inf
  spent = accountant.epsilon(noise, num_clients, cohort, rounds, delta, sampling=sampling,
                             accountant=name)
  assert spent == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("noise, rounds, delta", [(3.0, 10, 1e-3), (4.0, 40, 1e-5)])
def test_full_participation_on_pld_is_the_analytic_gaussian_and_below_rdp(noise, rounds,
                                                                          delta):
  from scipy import optimize, stats
  mu = 2 * math.sqrt(rounds) / noise  # sensitivity 2C over std noise * C, composed
  spent = optimize.brentq(lambda e: stats.norm.cdf(-e / mu + mu / 2) - math.exp(e)
                          * stats.norm.cdf(-e / mu - mu / 2) - delta, 0, 100)
  pld = accountant.epsilon(noise, 20, 20, rounds, delta)
  assert spent <= pld == pytest.approx(spent, rel=1e-4)
  assert pld < accountant.epsilon(noise, 20, 20, rounds, delta, accountant="rdp")


@pytest.mark.parametrize("sampling, num_clients, cohort, rounds",
                         [("poisson", 50, 20, 50), ("cohort", 200, 200, 10)])
@pytest.mark.parametrize("target", [0.5, 1.0, 4.0])
def test_calibrate_on_pld_spends_the_target_epsilon_within_1_percent(
    sampling, num_clients, cohort, rounds, target):
  delta = accountant.default_delta(num_clients)
  assert accountant.accountant_for(sampling, num_clients, cohort) == "pld"
  noise = accountant.calibrate(target, num_clients, cohort, rounds, delta, sampling=sampling)
  spent = reference_epsilons(sampling, "pld", num_clients, cohort, noise, rounds, delta)
  assert 0.99 * target <= spent <= target
  assert accountant.epsilon(noise, num_clients, cohort, rounds, delta,
                            sampling=sampling) == spent


@pytest.mark.parametrize("sampling, num_clients, cohort, given, resolved", [
    ("cohort", 50, 5, None, "rdp"), ("cohort", 50, 50, None, "pld"),
    ("poisson", 50, 5, None, "pld"), ("poisson", 50, 49, None, "pld"),
    ("cohort", 50, 5, "rdp", "rdp"), ("cohort", 50, 50, "rdp", "rdp"),
    ("cohort", 50, 50, "pld", "pld"), ("poisson", 50, 5, "pld", "pld"),
])
def test_accountant_for_resolves_the_accountant_of_the_sampling(sampling, num_clients,
                                                                cohort, given, resolved):
  assert accountant.accountant_for(sampling, num_clients, cohort, given) == resolved
  assert accountant.SAMPLINGS == ("cohort", "poisson")
  assert accountant.ACCOUNTANTS == ("pld", "rdp")


@pytest.mark.parametrize("call, match", [
    (lambda: accountant.accountant_for("uniform", 50, 5),
     r"^sampling = 'uniform' is unknown: it must be one of \('cohort', 'poisson'\); give"),
    (lambda: accountant.accountant_for("cohort", 50, 5, "gdp"),
     r"^accountant = 'gdp' is unknown: it must be one of \('pld', 'rdp'\) or None; give"),
    (lambda: accountant.accountant_for("cohort", 50, 5, "pld"),
     r"^accountant = 'pld' cannot account sampling='cohort' with cohort = 5 < num_clients = "
     r"50: .*use accountant='rdp'"),
    (lambda: accountant.accountant_for("poisson", 50, 5, "rdp"),
     r"^accountant = 'rdp' cannot account sampling='poisson': .*use accountant='pld'"),
    (lambda: accountant.accountant_for("poisson", 50, 50),
     r"^sampling = 'poisson' is out of range at cohort = num_clients = 50: .*"
     r"use sampling='cohort'"),
    (lambda: accountant.accountant_for("poisson", 50, 51), r"^cohort = 51 is out of range"),
    (lambda: accountant.epsilon(1.0, 50, 5, 10, 1e-3, sampling="poisson", accountant="rdp"),
     r"^accountant = 'rdp' cannot account"),
    (lambda: accountant.epsilons(1.0, 50, 5, [1, 2], 1e-3, accountant="pld"),
     r"^accountant = 'pld' cannot account"),
    (lambda: accountant.calibrate(1.0, 50, 50, 10, 1e-3, sampling="poisson"),
     r"^sampling = 'poisson' is out of range"),
    (lambda: accountant.record(1.0, 1.0, 1e-3, 1.0),
     r"^accountant = None cannot be resolved without num_clients and cohort"),
    (lambda: accountant.record(1.0, 1.0, 1e-3, 1.0, accountant="rdp", num_clients=50),
     r"^num_clients = 50 and cohort = None go together"),
    (lambda: accountant.record(1.0, 1.0, 1e-3, 1.0, sampling="poisson", accountant="rdp"),
     r"^accountant = 'rdp' cannot account sampling='poisson'"),
    (lambda: accountant.record(1.0, 1.0, 1e-3, 1.0, sampling="uniform", accountant="pld"),
     r"^sampling = 'uniform' is unknown"),
])
def test_a_sampling_the_accountant_cannot_account_is_refused_in_one_line(call, match):
  with pytest.raises(ValueError, match=match) as error:
    call()
  assert "\n" not in str(error.value)


def test_poisson_epsilons_are_epsilon_at_each_count():
  counts = [0, 1, 5, 5, 20]
  spent = accountant.epsilons(4.0, 100, 10, counts, 1e-3, sampling="poisson")
  assert spent == pytest.approx(
      [accountant.epsilon(4.0, 100, 10, r, 1e-3, sampling="poisson") for r in counts],
      rel=1e-9)
  assert 0.0 == spent[0] < spent[1] < spent[2] == spent[3] < spent[4]
  assert accountant.epsilons(0.0, 100, 10, [0, 3], 1e-3, sampling="poisson") == [0.0,
                                                                                 math.inf]
