"""SRPFL and the timed baselines: clock, schedule, masking, numpy reference, one compile."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import fedjax_rep as fr
from fedjax_rep.core.loop import split_run_key
from fedjax_rep.hetero import speeds, timed
import reference as ref

M, D, K, SAMPLES = 12, 6, 2, 8
RTOL, ATOL = 2e-4, 2e-5


def hparams(lr=0.1):
  return fr.LinearHparams(lr=jnp.float32(lr), head_lr=jnp.float32(lr))


def timed_hparams(participants, comm_cost=0.0):
  return timed.hparams(hparams(), participants, comm_cost)


def fixed_data(seed=0):
  problem = fr.make_problem(jax.random.key(seed), M, D, K, 0.1)
  return fr.make_fixed_data(jax.random.key(seed + 100), problem, SAMPLES)


def inner():
  return fr.FedRep(rep_dim=K, cohort=M, orthonormalize=True)


def test_wall_clock_of_a_three_round_run_is_exact():
  times = speeds.given_speeds([3.0, 1.0, 4.0, 2.0], 4)
  alg = timed.Timed(fr.FedRep(rep_dim=K, cohort=4), times, cohort=4, local_updates=2)
  problem = fr.make_problem(jax.random.key(0), 4, D, K, 0.1)
  result = fr.run(alg, fr.FreshData(problem, 5), timed_hparams([1, 2, 4], 0.5),
                  jax.random.key(1), 3, progress=False)
  # slowest kept client x 2 local updates + 0.5: 1*2+.5, 2*2+.5, 4*2+.5
  np.testing.assert_array_equal(result.metrics["wall_clock"], [2.5, 7.0, 15.5])
  np.testing.assert_array_equal(result.metrics["participants"], [1, 2, 4])


def test_srpfl_stages_double_from_n0_to_all():
  alg = timed.Timed(inner(), speeds.fixed_speeds(M), cohort=M)
  hp = timed_hparams(timed.srpfl_participants(M, 2, 12, 2))
  result = fr.run(alg, fixed_data(), hp, jax.random.key(0), 12, progress=False)
  np.testing.assert_array_equal(result.metrics["participants"],
                                [2, 2, 4, 4, 8, 8, 12, 12, 12, 12, 12, 12])


def test_with_equal_speeds_srpfl_updates_as_fedrep_on_the_same_clients():
  """Ties go to the lower cohort position: the kept clients are the cohort's first n."""
  data, n = fixed_data(), 5
  alg = timed.Timed(inner(), speeds.given_speeds(np.ones(M), M), cohort=M)
  hp = timed_hparams(timed.fixed_participants(M, n, 1))
  state = fr.init_state(alg, data, hp, jax.random.key(0))
  key = jax.random.key(3)
  new_state, metrics = jax.jit(alg.round)(state, key, data, hp)
  key_cohort, _, _, key_inner = jax.random.split(key, 4)
  kept = fr.sample_cohort(key_cohort, M, M)[:n]
  expected, expected_metrics = inner().masked_round(state.inner, key_inner, data, hparams(),
                                                    kept)
  np.testing.assert_allclose(new_state.inner.B, expected.B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(new_state.inner.heads, expected.heads, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(metrics["train_loss"], expected_metrics["train_loss"], rtol=RTOL)


def projection(B):
  Q = np.linalg.qr(np.asarray(B, np.float64))[0]
  return Q @ Q.T


def test_srpfl_with_qr_matches_reference():
  data = fixed_data()
  times = np.random.default_rng(0).exponential(size=M)
  alg = timed.Timed(inner(), speeds.given_speeds(times, M), cohort=8)
  hp = timed_hparams(timed.srpfl_participants(8, 2, 6, 2), 10.0)
  key = jax.random.key(5)
  state0 = fr.init_state(alg, data, hp, key)
  result = fr.run(alg, data, hp, key, 6, progress=False)
  X, y = np.asarray(data.X), np.asarray(data.y)
  B, heads = np.asarray(state0.inner.B), np.asarray(state0.inner.heads)
  rounds_key, clock, clocks, angles = split_run_key(key)[1], 0.0, [], []
  for t, n in enumerate([2, 2, 4, 4, 8, 8]):
    cohort = np.asarray(fr.sample_cohort(
        jax.random.split(jax.random.fold_in(rounds_key, t), 4)[0], M, 8))
    kept = cohort[np.argsort(times[cohort], kind="stable")[:n]]
    B, heads, _ = ref.fedrep_round(B, heads, X, y, kept, 0.1)
    B = np.linalg.qr(B)[0]
    clock += times[kept].max() + 10.0
    clocks.append(clock)
    angles.append(np.sin(np.max(scipy.linalg.subspace_angles(B, data.B_star))))
  np.testing.assert_allclose(projection(result.state.inner.B), projection(B), atol=1e-4)
  np.testing.assert_allclose(np.abs(result.state.inner.heads), np.abs(heads), rtol=1e-3,
                             atol=1e-4)
  np.testing.assert_allclose(result.metrics["wall_clock"], clocks, rtol=1e-6)
  np.testing.assert_allclose(result.metrics["principal_angle"], angles, rtol=1e-3, atol=1e-4)


def test_dropout_and_dynamic_speeds_keep_at_most_n_reporting_clients():
  alg = timed.Timed(inner(), speeds.dynamic_speeds(M, dropout=0.5), cohort=M)
  hp = timed_hparams(timed.fixed_participants(M, 6, 40))
  result = fr.run(alg, fixed_data(), hp, jax.random.key(0), 40, progress=False)
  participants = result.metrics["participants"]
  assert participants.max() <= 6 and participants.min() < 6  # sometimes < 6 report
  assert np.all(np.diff(result.metrics["wall_clock"]) > 0)


def test_a_whole_srpfl_run_compiles_once(compiles):
  """Stage changes are data (a mask), not shapes; so are schedules and C: SRPFL after
  straggler-prone FedRep, with new data, seed and C, runs the same program."""
  alg = timed.Timed(inner(), speeds.fixed_speeds(M), cohort=M)
  fedrep = timed_hparams(timed.fixed_participants(M, M, 20))
  srpfl = timed_hparams(timed.srpfl_participants(M, 3, 20, 3), 10.0)
  fr.run(alg, fixed_data(0), fedrep, jax.random.key(0), 20, chunk=7, progress=False)
  data, key = fixed_data(1), jax.random.key(1)
  compiles.reset()
  result = fr.run(alg, data, srpfl, key, 20, chunk=7, progress=False)
  assert compiles.count == 0
  assert len(set(result.metrics["participants"].tolist())) == 3  # 3, 6, 12 within one program


@pytest.mark.slow
def test_schedules_and_costs_sweep_as_one_vmap():
  data = fixed_data()
  alg = timed.Timed(inner(), speeds.fixed_speeds(M), cohort=M)
  runs = [timed_hparams(timed.srpfl_participants(M, 3, 10, 2), 1.0),
          timed_hparams(timed.fixed_participants(M, M, 10), 0.0)]
  swept = fr.run(alg, data, fr.stack(runs), jax.random.key(2),
                 10, sweep_axes=(None, 0, None), progress=False)
  for i, hp in enumerate(runs):
    single = fr.run(alg, data, hp, jax.random.key(2), 10, progress=False)
    for name in ("wall_clock", "principal_angle", "participants"):
      np.testing.assert_allclose(swept.metrics[name][i], single.metrics[name], rtol=1e-5,
                                 atol=1e-6)


@pytest.mark.slow
def test_fedavg_runs_on_the_clock_too():
  """Any algorithm with `masked_round` can be timed; an all-true mask is the plain round."""
  data = fixed_data()
  fedavg = fr.FedAvg(rep_dim=K, cohort=M, local_steps=2, init_method="random")
  state = fr.init_state(fedavg, data, hparams(), jax.random.key(0))
  clients = jnp.arange(M)
  plain = fedavg.masked_round(state, jax.random.key(1), data, hparams(), clients)[0]
  masked = fedavg.masked_round(state, jax.random.key(1), data, hparams(), clients,
                               jnp.ones(M, bool))[0]
  np.testing.assert_allclose(masked.B, plain.B, rtol=1e-6)
  alg = timed.Timed(fedavg, speeds.fixed_speeds(M), cohort=M)
  result = fr.run(alg, data, timed_hparams(timed.srpfl_participants(M, 3, 8, 2)),
                  jax.random.key(2), 8, progress=False)
  np.testing.assert_array_equal(result.metrics["participants"], [3, 3, 6, 6, 12, 12, 12, 12])
  assert np.all(np.diff(result.metrics["wall_clock"]) > 0)
