"""System heterogeneity: speed models, the virtual wall clock and the SRPFL schedule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_rep.hetero import clock, schedule, speeds


def test_wall_clock_of_three_rounds_is_exact():
  times = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.5, 1.0], [2.0, 2.0, 2.0]])
  mask = jnp.array([[True, True, False], [False, True, True], [False, False, False]])
  # rounds: 2 * max(1, 2) + 0.5, 2 * max(0.5, 1) + 0.5, 0 + 0.5 (nobody participates)
  np.testing.assert_allclose(clock.wall_clock(times, mask, 2, 0.5), [4.5, 7.0, 7.5])
  duration = jax.jit(clock.round_duration)(times[0], mask[0], 2, jnp.float32(0.5))
  np.testing.assert_allclose(duration, 4.5)


@pytest.mark.parametrize("num_clients, n0, sizes", [
    (80, 10, [10, 20, 40, 80]),
    (100, 10, [10, 20, 40, 80, 100]),
    (7, 1, [1, 2, 4, 7]),
    (5, 5, [5]),
])
def test_stage_sizes_double_up_to_all_clients(num_clients, n0, sizes):
  np.testing.assert_array_equal(schedule.stage_sizes(num_clients, n0), sizes)


def test_participants_per_round_follow_the_stages():
  sizes, stages = schedule.participants(100, 10, 12, 2)
  np.testing.assert_array_equal(sizes, [10, 10, 20, 20, 40, 40, 80, 80, 100, 100, 100, 100])
  np.testing.assert_array_equal(stages, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 4])
  sizes, stages = schedule.participants(100, 10, 5, [1, 0, 3, 2])
  np.testing.assert_array_equal(sizes, [10, 40, 40, 40, 80])
  np.testing.assert_array_equal(stages, [0, 2, 2, 2, 3])


def test_theorem_stage_rounds_match_eq_206_between_doubling_points():
  a, num_clients = 0.1, 1024
  rounds = schedule.theorem_stage_rounds(num_clients, 1, a, dist0=1e3)
  e = schedule.expected_order_stat(num_clients, schedule.stage_sizes(num_clients, 1))
  eq206 = 2 * np.log(np.sqrt(2) * np.diff(e)[1:] / np.diff(e)[:-1]) / np.log(1 / (1 - a))
  # x_r sits at or just below the doubling point, so a stage is at most one round shorter
  assert np.all(rounds[1:] <= np.ceil(eq206)) and np.all(rounds[1:] >= np.ceil(eq206) - 1)


def test_fastest_mask_picks_exactly_the_n_fastest_with_a_traced_n(compiles):
  times = jnp.array([3.0, 1.0, 2.0, 1.0, 5.0, 0.5])
  pick = jax.jit(schedule.fastest_mask)
  np.testing.assert_array_equal(pick(times, 2), [False, True, False, False, False, True])
  compiles.reset()
  for n in range(7):  # ties (clients 1 and 3) go to the lower index
    expected = np.zeros(6, bool)
    expected[np.argsort(np.asarray(times), kind="stable")[:n]] = True
    np.testing.assert_array_equal(pick(times, n), expected)
  assert compiles.count == 0


def test_fixed_speeds_are_constant_and_dynamic_ones_have_mean_one_over_rate():
  key, num_rounds = jax.random.key(0), 20000
  rounds = jnp.arange(num_rounds)

  def all_rounds(model):
    params = speeds.init(model, jax.random.key(1))
    times = jax.jit(jax.vmap(lambda t: speeds.round_times(model, params, key, t)))(rounds)
    return params, np.asarray(times)

  params, times = all_rounds(speeds.fixed_speeds(5, rate=2.0))
  assert times.shape == (num_rounds, 5)
  np.testing.assert_array_equal(times, np.broadcast_to(params, times.shape))
  rates, times = all_rounds(speeds.dynamic_speeds(5))
  assert np.all((rates >= 1 / 5) & (rates <= 1))
  assert np.all(times.std(axis=0) > 0)
  np.testing.assert_allclose(times.mean(axis=0), 1 / np.asarray(rates), rtol=0.05)


def test_given_speeds_array_and_function():
  model = speeds.given_speeds([1.0, 2.0, 0.5], 3)
  params = speeds.init(model, jax.random.key(0))
  np.testing.assert_allclose(speeds.round_times(model, params, jax.random.key(1), 4),
                             [1.0, 2.0, 0.5])
  model = speeds.given_speeds(lambda key, t: jnp.full(3, 1.0) * t, 3)
  params = speeds.init(model, jax.random.key(0))
  times = jax.jit(lambda t: speeds.round_times(model, params, jax.random.key(1), t))(2.0)
  np.testing.assert_allclose(times, [2.0, 2.0, 2.0])


def test_dropout_rate_matches_p():
  model = speeds.fixed_speeds(20000, dropout=0.3)
  reported = speeds.reporting(model, jax.random.key(0))
  assert reported.shape == (20000,) and reported.dtype == bool
  assert abs(float(jnp.mean(reported)) - 0.7) < 0.02
  assert bool(jnp.all(speeds.reporting(speeds.fixed_speeds(10), jax.random.key(0))))


def test_expected_order_statistic_matches_monte_carlo():
  num_clients, rate = 10, 2.0
  draws = np.random.default_rng(0).exponential(1 / rate, (200000, num_clients))
  monte_carlo = np.sort(draws, axis=1).mean(axis=0)
  expected = schedule.expected_order_stat(num_clients, np.arange(1, num_clients + 1), rate)
  np.testing.assert_allclose(expected, monte_carlo, rtol=0.02)
  assert schedule.expected_order_stat(num_clients, 0) == 0


def test_expected_wall_clock_of_srpfl_beats_fedrep():
  sizes, _ = schedule.participants(100, 10, 50, 5)
  srpfl = schedule.expected_wall_clock(100, sizes, comm_cost=1.0)
  fedrep = schedule.expected_wall_clock(100, np.full(50, 100), comm_cost=1.0)
  np.testing.assert_allclose(fedrep, 50 * (schedule.expected_order_stat(100, 100) + 1.0))
  assert srpfl < fedrep
  assert schedule.theorem46_ratio(10**4, 1.3) < schedule.theorem46_ratio(100, 1.3) < 1


@pytest.mark.parametrize("call, match", [
    (lambda: schedule.stage_sizes(100, 0), r"n0 must be an integer in \[1, num_clients=100\]"),
    (lambda: schedule.participants(100, 101, 10, 2), r"n0 .* \[1, num_clients=100\]"),
    (lambda: schedule.participants(100, 10, 10, 0), "stage_rounds must be an integer >= 1"),
    (lambda: schedule.participants(100, 10, 10, [1, 2]), r"stage_rounds .*=4\]"),
    (lambda: schedule.participants(100, 10, 0, 2), "num_rounds must be an integer >= 1"),
    (lambda: clock.round_duration(np.ones(3), np.ones(3, bool), 1, -1.0),
     "comm_cost must be >= 0"),
    (lambda: schedule.expected_wall_clock(10, [5], comm_cost=-2.0), "comm_cost must be >= 0"),
    (lambda: speeds.fixed_speeds(10, dropout=1.0), r"dropout must be a probability in \[0, 1\)"),
    (lambda: speeds.dynamic_speeds(10, dropout=-0.1), r"dropout .* \[0, 1\)"),
    (lambda: speeds.fixed_speeds(10, rate=0.0), "rate must be > 0"),
    (lambda: speeds.given_speeds(np.ones(4), 5), r"times must be an array \[num_clients=5\]"),
    (lambda: speeds.given_speeds(lambda key, t: jnp.ones(4), 5),
     r"speed function must return times \[num_clients=5\]; got shape \(4,\)"),
    (lambda: speeds.given_speeds([1.0, -1.0], 2), "times must be finite and >= 0"),
    (lambda: schedule.expected_order_stat(10, 11), r"n must be in \[0, num_clients=10\]"),
    (lambda: schedule.theorem_stage_rounds(100, 10, 0.0, 1.0), r"a must be in \(0, 1\)"),
    (lambda: schedule.theorem46_ratio(100, 1.5), r"c_hat must be in \(1, sqrt\(2\)\)"),
])
def test_bad_inputs_are_rejected_before_any_work(call, match, compiles):
  compiles.reset()
  with pytest.raises(ValueError, match=match):
    call()
  assert compiles.count == 0


def test_calibrated_theorem_rounds_give_every_stage_rounds():
  """With a measured floor0 (well below dist0) every stage before the last gets rounds;
  the bound's own floor (about 2) is above dist0 = 0.3 and gives the early stages none."""
  rounds = schedule.theorem_stage_rounds(1000, 10, 0.1, 0.3, floor0=0.03)
  assert len(rounds) == 7 and np.all(rounds >= 1)  # stages 10, 20, ..., 640 before 1000
  assert rounds[0] == rounds.max()  # the cheapest stage does the most work
  np.testing.assert_array_equal(schedule.theorem_stage_rounds(1000, 10, 0.1, 0.3)[:6], 0)
