"""FedAvg with tau local steps (FedAvg-FT) against numpy references. (The FedAvg-FT recipes'
quick runs are checked in notebooks/02_fedavg_ft.ipynb, run by tests/test_notebooks.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
import reference as ref
from test_linear_algorithms import RTOL, ATOL, cohorts

N, D, K = 10, 12, 3


def population(seed=0):
  problem = fr.make_problem(jax.random.key(seed), N, D, K, 0.0, normalize_heads=False)
  return problem, fr.PopulationData(problem)


def hparams(lr=0.2):
  return fr.LinearHparams(lr=jnp.float32(lr), head_lr=jnp.float32(lr))


@pytest.mark.parametrize("local_steps,cohort", [(1, N), (2, N), (5, N), (3, 4)])
def test_population_fedavg_matches_reference(local_steps, cohort):
  problem, data = population()
  algorithm = fr.FedAvg(rep_dim=K, cohort=cohort, local_steps=local_steps,
                        init_method="random-scaled")
  key = jax.random.key(3)
  state0 = fr.init_state(algorithm, data, hparams(), key).replace(w=jnp.full((K,), 0.3))
  result = fr.run(algorithm, data, hparams(), key, 6, state=state0, progress=False)
  theta_stars = np.asarray(problem.W_star @ problem.B_star.T, np.float64)
  B, w = np.asarray(state0.B), np.asarray(state0.w)
  for clients in cohorts(key, N, cohort, 6):
    B, w = ref.fedavg_population_round(B, w, theta_stars, clients, 0.2, local_steps)
  np.testing.assert_allclose(result.state.B, B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.state.w, w, rtol=RTOL, atol=ATOL)
  # metrics at the final global model
  residual = B @ w - theta_stars.mean(axis=0)
  grad_norm = np.sqrt(np.sum(np.outer(residual, w) ** 2) + np.sum((B.T @ residual) ** 2))
  np.testing.assert_allclose(result.metrics["global_grad_norm"][-1], grad_norm, rtol=1e-3)
  conditioning = np.linalg.norm(np.eye(K) - 0.2 * B.T @ B, 2)
  np.testing.assert_allclose(result.metrics["conditioning"][-1], conditioning, rtol=1e-3,
                             atol=1e-5)


def test_datasets_of_different_sizes_weigh_by_sample_count():
  rng = np.random.default_rng(0)
  counts = np.array([3, 8, 5, 1])
  X = [rng.standard_normal((c, D)) for c in counts]
  y = [rng.standard_normal(c) for c in counts]
  padded_X = np.zeros((4, 8, D))
  padded_y = np.full((4, 8), 99.0)  # garbage in the padding must not matter
  for i, c in enumerate(counts):
    padded_X[i, :c], padded_y[i, :c] = X[i], y[i]
  data = fr.client_data(padded_X, padded_y, counts=counts)
  B0, w0 = rng.standard_normal((D, K)) * 0.3, rng.standard_normal(K) * 0.3
  state = fr.GlobalState(B=jnp.asarray(B0, jnp.float32), w=jnp.asarray(w0, jnp.float32))
  result = fr.run(fr.FedAvg(rep_dim=K, cohort=4, local_steps=3), data, hparams(0.05),
                  jax.random.key(0), 1, state=state, progress=False)
  new_Bs, new_ws = [], []
  for i in range(4):  # each client on its real samples only
    B, w, _ = ref.fedavg_round(B0, w0, [X[i]], [y[i]], [0], 0.05, 3)
    new_Bs.append(B)
    new_ws.append(w)
  weights = counts / counts.sum()
  np.testing.assert_allclose(result.state.B, np.einsum("c,cdk->dk", weights, new_Bs),
                             rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.state.w, weights @ np.array(new_ws), rtol=RTOL, atol=ATOL)
  with pytest.raises(ValueError, match=r"counts must be \[clients=4\] integers in \[1, "):
    fr.client_data(padded_X, padded_y, counts=[3, 9, 5, 1])


def test_random_scaled_init_makes_sqrt_lr_B_orthonormal():
  _, data = population()
  state = fr.init_state(fr.FedAvg(rep_dim=K, cohort=N, init_method="random-scaled"), data,
                        hparams(0.2), jax.random.key(0))
  np.testing.assert_allclose(0.2 * state.B.T @ state.B, np.eye(K), atol=1e-5)


@pytest.mark.parametrize("mode", ["population", "fixed"])
def test_tau_one_is_a_step_of_distributed_gd_on_the_averaged_loss(mode):
  problem, data = population()
  if mode == "fixed":
    data = fr.make_fixed_data(jax.random.key(1), problem, 7)
  algorithm = fr.FedAvg(rep_dim=K, cohort=N, local_steps=1)
  state = fr.GlobalState(B=jax.random.normal(jax.random.key(2), (D, K)), w=jnp.ones(K))
  result = fr.run(algorithm, data, hparams(0.05), jax.random.key(0), 1, state=state,
                  progress=False)

  def averaged_loss(params):  # the global objective, written directly
    B, w = params
    if mode == "fixed":
      return jnp.mean(0.5 * jnp.mean((jnp.einsum("nmd,d->nm", data.X, B @ w) - data.y) ** 2,
                                     axis=1))
    theta_stars = problem.W_star @ problem.B_star.T
    return jnp.mean(0.5 * jnp.sum((B @ w - theta_stars) ** 2, axis=1))

  grad_B, grad_w = jax.grad(averaged_loss)((state.B, state.w))
  np.testing.assert_allclose(result.state.B, state.B - 0.05 * grad_B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.state.w, state.w - 0.05 * grad_w, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_seed_sweep_runs_as_one_vmapped_program(compiles):
  datas = [population(seed)[1] for seed in range(4)]
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *datas)
  keys = jax.vmap(jax.random.key)(jnp.arange(4))
  algorithm = fr.FedAvg(rep_dim=K, cohort=N, local_steps=2, init_method="random-scaled")
  swept = fr.run(algorithm, stacked, hparams(), keys, 8, sweep_axes=(0, None, 0),
                 progress=False)
  assert swept.metrics["principal_angle"].shape == (4, 8)
  compiles.reset()
  fr.run(algorithm, stacked, hparams(), keys, 8, sweep_axes=(0, None, 0), progress=False)
  assert compiles.count == 0  # the whole sweep is one cached program
  for s in range(4):
    single = fr.run(algorithm, datas[s], hparams(), jax.random.key(s), 8, progress=False)
    np.testing.assert_allclose(swept.state.B[s], single.state.B, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(swept.metrics["principal_angle"][s],
                               single.metrics["principal_angle"], rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("train_body", [True, False])
def test_fine_tuning_matches_reference(train_body):
  rng = np.random.default_rng(0)
  B, w = rng.standard_normal((D, K)) * 0.5, rng.standard_normal(K) * 0.5
  X, y = rng.standard_normal((3, 8, D)), rng.standard_normal((3, 8))
  thetas = fr.fine_tuned_models(jnp.asarray(B, jnp.float32), jnp.asarray(w, jnp.float32),
                                (jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)),
                                0.05, 20, train_body)
  expected = [ref.fine_tune(B, w, X[i], y[i], 0.05, 20, train_body) for i in range(3)]
  np.testing.assert_allclose(thetas, expected, rtol=1e-3, atol=1e-5)


def test_fine_tune_error_matches_reference():
  problem, _ = population()
  B = problem.B_star + 0.1 * jax.random.normal(jax.random.key(1), problem.B_star.shape)
  w = jnp.full((K,), 0.1)
  errors = fr.fine_tune_error(jax.random.key(2), B, w, problem.B_star, 0.1, jnp.float32(0.05),
                              sample_counts=(4, 9), num_clients=3, steps=30)
  key_heads, key_train = jax.random.split(jax.random.key(2))
  heads = jax.random.normal(key_heads, (3, K))
  X, y = map(np.asarray, fr.sample(key_train, problem.B_star, heads, 0.1, 9))
  targets = np.asarray(heads @ problem.B_star.T)
  for j, n in enumerate((4, 9)):
    expected = np.mean([np.sum((ref.fine_tune(np.asarray(B), np.asarray(w), X[i, :n], y[i, :n],
                                              0.05, 30) - targets[i]) ** 2) for i in range(3)])
    np.testing.assert_allclose(errors[j], expected, rtol=1e-3)
