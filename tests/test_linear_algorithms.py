"""Every linear algorithm against the numpy per-client reference, under jit and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import fedjax_rep as fr
from fedjax_rep.core.loop import split_run_key
import reference as ref

N, M, D, K = 12, 8, 6, 2
ROUNDS = 5
RTOL, ATOL = 2e-4, 2e-5


def fixed_data(seed=0, n=N, m=M, test_samples=0):
  problem = fr.make_problem(jax.random.key(seed), n, D, K, 0.1)
  return fr.make_fixed_data(jax.random.key(seed + 100), problem, m, test_samples)


def hparams(lr=0.1, head_lr=0.05):
  return fr.LinearHparams(lr=jnp.float32(lr), head_lr=jnp.float32(head_lr))


def cohorts(key, n, cohort, rounds):
  """The cohorts the engine samples in rounds 0..rounds-1 of a run with `key`."""
  rounds_key = split_run_key(key)[1]
  return [np.asarray(fr.sample_cohort(jax.random.split(jax.random.fold_in(rounds_key, t))[0],
                                      n, cohort)) for t in range(rounds)]


@pytest.mark.parametrize("head_steps,cohort", [(None, N), (1, N), (10, N), (None, 5), (3, 5)])
def test_fedrep_family_matches_reference(head_steps, cohort):
  data = fixed_data(test_samples=4)
  algorithm = fr.FedRep(rep_dim=K, cohort=cohort, head_steps=head_steps)
  key = jax.random.key(7)
  state0 = fr.init_state(algorithm, data, hparams(), key)
  result = fr.run(algorithm, data, hparams(), key, ROUNDS, progress=False)

  X, y = np.asarray(data.X), np.asarray(data.y)
  B, heads = np.asarray(state0.B), np.asarray(state0.heads)
  losses, angles, errors = [], [], []
  for clients in cohorts(key, N, cohort, ROUNDS):
    B, heads, loss = ref.fedrep_round(B, heads, X, y, clients, 0.1, head_steps, 0.05)
    losses.append(loss)
    angles.append(np.sin(np.max(scipy.linalg.subspace_angles(B, data.B_star))))
    thetas = [B @ ref.least_squares(X[i] @ B, y[i]) for i in range(N)]
    errors.append(ref.test_error(thetas, np.asarray(data.X_test), np.asarray(data.y_test)))
  np.testing.assert_allclose(result.state.B, B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.state.heads, heads, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.metrics["train_loss"], losses, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.metrics["principal_angle"], angles, rtol=1e-3, atol=1e-4)
  np.testing.assert_allclose(result.metrics["test_error"], errors, rtol=1e-3, atol=ATOL)


def with_test_counts(data, test_counts):
  """`data` with per-client test counts (its test rows past them zeroed, as client_data does)."""
  return fr.client_data(data.X, data.y, X_test=data.X_test, y_test=data.y_test,
                        B_star=data.B_star, test_counts=test_counts)


ISSUE_CASE = [0] * 11 + [4]  # 11 of 12 clients without test samples (issue 47)


@pytest.mark.parametrize("test_counts", [ISSUE_CASE, [4, 0, 1, 3, 0, 2, 4, 4, 0, 1, 2, 3]])
def test_test_error_leaves_out_clients_without_test_samples(test_counts):
  """FedRep's and FedAvg's test_error with test_counts: the reference's mean over the
  clients tested of each one's error on its test samples; test_clients counts them; the
  check names the clients left out."""
  untested = [i for i, t in enumerate(test_counts) if not t]
  data = with_test_counts(fixed_data(test_samples=4), test_counts)
  key = jax.random.key(7)
  X, y = np.asarray(data.X), np.asarray(data.y)
  X_test, y_test = np.asarray(data.X_test), np.asarray(data.y_test)
  pattern = rf"^{len(untested)} of {N} clients have no test samples \(clients {untested[0]}, "
  for algorithm in (fr.FedRep(rep_dim=K, cohort=5), fr.FedAvg(rep_dim=K, cohort=5)):
    with pytest.warns(UserWarning, match=pattern):  # both check the data
      state0 = fr.init_state(algorithm, data, hparams(), key)
      result = fr.run(algorithm, data, hparams(), key, ROUNDS, progress=False)
    errors = []
    if isinstance(algorithm, fr.FedRep):
      B, heads = np.asarray(state0.B), np.asarray(state0.heads)
      for clients in cohorts(key, N, 5, ROUNDS):
        B, heads, _ = ref.fedrep_round(B, heads, X, y, clients, 0.1)
        thetas = [B @ ref.least_squares(X[i] @ B, y[i]) for i in range(N)]
        errors.append(ref.test_error(thetas, X_test, y_test, test_counts))
    else:
      B, w = np.asarray(state0.B), np.asarray(state0.w)
      for clients in cohorts(key, N, 5, ROUNDS):
        B, w, _ = ref.fedavg_round(B, w, X, y, clients, 0.1, algorithm.local_steps)
        errors.append(ref.test_error([B @ w] * N, X_test, y_test, test_counts))
    np.testing.assert_allclose(result.metrics["test_error"], errors, rtol=1e-3, atol=ATOL)
    np.testing.assert_array_equal(result.metrics["test_clients"], N - len(untested))


def test_test_counts_all_zero_or_out_of_range_are_errors():
  data = fixed_data(test_samples=4)
  with pytest.raises(ValueError, match="test_counts are all 0"):
    with_test_counts(data, [0] * N)
  with pytest.raises(ValueError, match=r"test_counts\[2\] = 5 \(client 2\)"):
    with_test_counts(data, [4, 4, 5] + [4] * (N - 3))
  with pytest.raises(ValueError, match="without X_test"):
    fr.client_data(data.X, data.y, test_counts=[1] * N)


def test_unsampled_clients_keep_their_heads():
  data = fixed_data()
  algorithm = fr.FedRep(rep_dim=K, cohort=3)
  key = jax.random.key(3)
  state = fr.init_state(algorithm, data, hparams(), key)
  state = state.replace(heads=jnp.ones_like(state.heads) * 7.0)
  result = fr.run(algorithm, data, hparams(), key, 1, state=state, progress=False)
  (clients,) = cohorts(key, N, 3, 1)
  others = np.setdiff1d(np.arange(N), clients)
  np.testing.assert_array_equal(result.state.heads[others], 7.0)
  assert not np.allclose(result.state.heads[clients], 7.0)


@pytest.mark.parametrize("local_steps,cohort", [(1, N), (4, N), (3, 5)])
def test_fedavg_matches_reference(local_steps, cohort):
  data = fixed_data()
  algorithm = fr.FedAvg(rep_dim=K, cohort=cohort, local_steps=local_steps)
  key = jax.random.key(11)
  state0 = fr.init_state(algorithm, data, hparams(), key)
  state0 = state0.replace(w=jnp.full((K,), 0.5))  # a nonzero head so that B moves in round 1
  result = fr.run(algorithm, data, hparams(), key, ROUNDS, state=state0, progress=False)
  X, y = np.asarray(data.X), np.asarray(data.y)
  B, w = np.asarray(state0.B), np.asarray(state0.w)
  losses = []
  for clients in cohorts(key, N, cohort, ROUNDS):
    B, w, loss = ref.fedavg_round(B, w, X, y, clients, 0.1, local_steps)
    losses.append(loss)
  np.testing.assert_allclose(result.state.B, B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.state.w, w, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.metrics["train_loss"], losses, rtol=RTOL, atol=ATOL)


def test_fedavg_head_fit_personal_models():
  data = fixed_data()
  state = fr.GlobalState(B=jnp.asarray(np.random.default_rng(0).standard_normal((D, K)),
                                       jnp.float32), w=jnp.ones(K))
  thetas = fr.FedAvg(rep_dim=K, cohort=N, head_fit=True).personal_models(state, data)
  B, X, y = np.asarray(state.B), np.asarray(data.X), np.asarray(data.y)
  expected = [B @ ref.least_squares(X[i] @ B, y[i]) for i in range(N)]
  np.testing.assert_allclose(thetas, expected, rtol=RTOL, atol=ATOL)
  shared = fr.FedAvg(rep_dim=K, cohort=N).personal_models(state, data)
  np.testing.assert_allclose(shared, np.tile(B @ np.ones(K), (N, 1)), rtol=1e-6)


def test_fresh_data_round_matches_reference():
  """Fresh mode: the batch of round t is sample_clients(split(fold_in(rounds_key, t))[1])."""
  problem = fr.make_problem(jax.random.key(0), N, D, K, 0.1)
  data = fr.FreshData(problem, M)
  algorithm = fr.FedRep(rep_dim=K, cohort=5)
  key = jax.random.key(5)
  state0 = fr.init_state(algorithm, data, hparams(), key)
  result = fr.run(algorithm, data, hparams(), key, 3, progress=False)
  rounds_key = split_run_key(key)[1]
  B, heads = np.asarray(state0.B), np.asarray(state0.heads)
  for t in range(3):
    key_cohort, key_data = jax.random.split(jax.random.fold_in(rounds_key, t))
    X, y = fr.sample_clients(key_data, problem, jnp.arange(N), M)
    clients = np.asarray(fr.sample_cohort(key_cohort, N, 5))
    B, heads, _ = ref.fedrep_round(B, heads, np.asarray(X), np.asarray(y), clients, 0.1)
  np.testing.assert_allclose(result.state.B, B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.state.heads, heads, rtol=RTOL, atol=ATOL)


def test_fresh_samples_do_not_depend_on_the_cohort():
  problem = fr.make_problem(jax.random.key(0), N, D, K, 0.1)
  key = jax.random.key(1)
  X_all, y_all = fr.sample_clients(key, problem, jnp.arange(N), M)
  X_some, y_some = fr.sample_clients(key, problem, jnp.array([7, 2]), M)
  # the same random bits; the vectorised normal transform may differ in the last float bit
  np.testing.assert_allclose(X_some, X_all[jnp.array([7, 2])], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(y_some, y_all[jnp.array([7, 2])], rtol=1e-6, atol=1e-6)


def test_seed_sweep_is_one_vmapped_run_matching_single_runs():
  keys = jax.vmap(jax.random.key)(jnp.arange(3))
  datas = [fixed_data(seed) for seed in range(3)]
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *datas)
  algorithm = fr.FedRep(rep_dim=K, cohort=5)
  swept = fr.run(algorithm, stacked, hparams(), keys, ROUNDS, sweep_axes=(0, None, 0),
                 progress=False)
  assert swept.metrics["principal_angle"].shape == (3, ROUNDS)
  for s in range(3):
    single = fr.run(algorithm, datas[s], hparams(), jax.random.key(s), ROUNDS, progress=False)
    np.testing.assert_allclose(swept.state.B[s], single.state.B, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(swept.metrics["train_loss"][s], single.metrics["train_loss"],
                               rtol=RTOL, atol=ATOL)


def test_step_size_sweep_is_a_vmap_over_hparams():
  data = fixed_data()
  lrs = jnp.array([0.05, 0.1, 0.2], jnp.float32)
  swept_hparams = fr.LinearHparams(lr=lrs, head_lr=jnp.full(3, 0.05, jnp.float32))
  algorithm = fr.FedRep(rep_dim=K, cohort=N)
  swept = fr.run(algorithm, data, swept_hparams, jax.random.key(0), ROUNDS,
                 sweep_axes=(None, 0, None), progress=False)
  for s, lr in enumerate([0.05, 0.1, 0.2]):
    single = fr.run(algorithm, data, hparams(lr=lr), jax.random.key(0), ROUNDS, progress=False)
    np.testing.assert_allclose(swept.state.B[s], single.state.B, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_round_runs_without_jit():
  data = fixed_data()
  algorithm = fr.FedRep(rep_dim=K, cohort=N)
  jitted = fr.run(algorithm, data, hparams(), jax.random.key(0), 2, progress=False)
  with jax.disable_jit():
    eager = fr.run(algorithm, data, hparams(), jax.random.key(0), 2, progress=False)
  np.testing.assert_allclose(eager.state.B, jitted.state.B, rtol=RTOL, atol=ATOL)


def test_method_of_moments_matches_reference():
  data = fixed_data()
  B0 = fr.method_of_moments(data.X, data.y, K)
  expected = ref.method_of_moments(np.asarray(data.X), np.asarray(data.y), K)
  assert float(fr.principal_angle(B0, jnp.asarray(expected, jnp.float32))) < 1e-3


@pytest.mark.slow
def test_fedrep_converges_and_more_clients_help():
  """The paper's point (Fig. 3), on a small fixed-data instance."""
  algorithm_for = lambda n: fr.FedRep(rep_dim=2, cohort=fr.cohort_size(n, 0.1))
  finals = {}
  for n in (10, 300):
    problem = fr.make_problem(jax.random.key(0), n, 10, 2, 0.03)
    data = fr.make_fixed_data(jax.random.key(1), problem, 5)
    result = fr.run(algorithm_for(n), data, hparams(0.1), jax.random.key(2), 150, progress=False)
    finals[n] = result.metrics["principal_angle"][-1]
  assert finals[300] < 0.05 < finals[10]


def test_local_models_match_lstsq():
  rng = np.random.default_rng(0)
  for m, d in [(30, 5), (3, 8)]:  # overdetermined: least squares; underdetermined: min norm
    X = rng.standard_normal((4, m, d)).astype(np.float32)
    y = rng.standard_normal((4, m)).astype(np.float32)
    thetas = fr.local_models(jnp.asarray(X), jnp.asarray(y))
    expected = [np.linalg.lstsq(X[i].astype(np.float64), y[i], rcond=None)[0] for i in range(4)]
    np.testing.assert_allclose(thetas, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_new_client_error_with_the_true_representation_is_the_noise():
  B_star = fr.make_problem(jax.random.key(0), 1, 20, 2, 0.1).B_star
  error = fr.new_client_error(jax.random.key(1), B_star, B_star, 0.1, sample_counts=(50,),
                              num_clients=50, test_samples=200)
  local = fr.new_client_error(jax.random.key(1), None, B_star, 0.1, sample_counts=(5, 100),
                              num_clients=50, test_samples=200)
  assert abs(float(error[0]) - 0.01) < 0.003
  assert float(local[0]) > 1.0  # 5 samples in R^20: most of the signal (||theta||^2 = 2) missed
  assert abs(float(local[1]) - 0.01) < 0.005  # 100 samples in R^20: close to the noise


def test_new_client_error_matches_reference():
  B_star = fr.make_problem(jax.random.key(0), 1, 8, 2, 0.1).B_star
  B = B_star + 0.2 * jax.random.normal(jax.random.key(9), B_star.shape)
  errors = fr.new_client_error(jax.random.key(1), B, B_star, 0.1, sample_counts=(1, 3, 6),
                               num_clients=4, test_samples=30)
  key_heads, key_train, key_test = jax.random.split(jax.random.key(1), 3)
  heads = fr.linear.problem.random_heads(key_heads, 4, 2)
  X, y = map(np.asarray, fr.sample(key_train, B_star, heads, 0.1, 6))
  X_test, y_test = map(np.asarray, fr.sample(key_test, B_star, heads, 0.1, 30))
  Bn = np.asarray(B, np.float64)
  for j, m in enumerate((1, 3, 6)):
    thetas = [Bn @ ref.least_squares(X[i, :m] @ Bn, y[i, :m]) for i in range(4)]
    np.testing.assert_allclose(errors[j], ref.test_error(thetas, X_test, y_test), rtol=1e-3)
