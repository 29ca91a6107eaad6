"""Linear FLUTE, FedRep(RI), under-parameterised problems and divergence handling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import fedjax_rep as fr
from fedjax_rep.linear.flute import LOSSES
import reference as ref

M, D, K, N = 9, 6, 2, 8
ROUNDS = 5
RTOL, ATOL = 2e-4, 2e-5


def problem(seed=0, kind="linear", samples=N, pad_to=None):
  models = fr.make_models(jax.random.key(seed), M, D, kind)
  return models, fr.make_underparam_data(jax.random.key(seed + 1), models, K, samples,
                                         0.3 ** 0.5, pad_to=pad_to)


def hparams(lr=0.01, reg_lr=None, gamma1=None, gamma2=None):
  as_array = lambda v: None if v is None else jnp.float32(v)
  return fr.LinearHparams(lr=jnp.float32(lr), head_lr=jnp.float32(lr), reg_lr=as_array(reg_lr),
                          gamma1=as_array(gamma1), gamma2=as_array(gamma2))


def real_rows(data):
  """Per-client unpadded (X_i [N_i, d], y_i [N_i])."""
  counts = np.asarray(data.sample_counts(jnp.arange(data.num_clients)), int)
  X, y = np.asarray(data.X), np.asarray(data.y)
  return [X[i, :c] for i, c in enumerate(counts)], [y[i, :c] for i, c in enumerate(counts)]


@pytest.mark.slow
def test_spectrum_rank_k_floor_and_top_subspace():
  models, _ = problem()
  np.testing.assert_allclose(np.linalg.svd(np.asarray(models), compute_uv=False),
                             2 * D - np.arange(D), rtol=1e-5)
  Phi = np.asarray(models, np.float64).T  # d x M
  U, s, Vt = np.linalg.svd(Phi, full_matrices=False)
  for k in (1, 3, 5):
    Phi_k = U[:, :k] * s[:k] @ Vt[:k]
    floor = np.mean(np.linalg.norm(Phi_k - Phi, axis=0))
    np.testing.assert_allclose(fr.rank_k_error(models, k), floor, rtol=1e-5)
    angles = scipy.linalg.subspace_angles(np.asarray(fr.top_subspace(models, k)), U[:, :k])
    assert np.max(angles) < 1e-3
  geometric = np.linalg.svd(np.asarray(fr.make_models(jax.random.key(0), M, D, "geometric")),
                            compute_uv=False)
  np.testing.assert_allclose(geometric, 2 * D * 0.7 ** np.arange(D), rtol=1e-5)
  assert fr.make_models(jax.random.key(0), M, D, "gaussian").shape == (M, D)


@pytest.mark.parametrize("loss,pad_to,reg_lr,gamma1", [
    ("half-mean", None, None, None), ("mean", None, 0.02, 0.1), ("half-mean", 12, 0.005, None)])
def test_flute_matches_reference(loss, pad_to, reg_lr, gamma1):
  models, data = problem(pad_to=pad_to)
  algorithm = fr.Flute(rep_dim=K, loss=loss)
  hp = hparams(reg_lr=reg_lr, gamma1=gamma1)
  key = jax.random.key(4)
  state0 = fr.init_state(algorithm, data, hp, key)
  result = fr.run(algorithm, data, hp, key, ROUNDS, progress=False)
  Xs, ys = real_rows(data)
  B, heads = np.asarray(state0.B), np.asarray(state0.heads)
  errors = []
  for _ in range(ROUNDS):
    B, heads = ref.flute_round(B, heads, Xs, ys, 0.01, reg_lr or 0.01, gamma1 or 0.25, 0.125,
                               LOSSES[loss])
    errors.append(np.mean(np.linalg.norm(heads @ B.T - np.asarray(models), axis=1)))
  np.testing.assert_allclose(result.state.B, B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.state.heads, heads, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(result.metrics["model_error"], errors, rtol=RTOL, atol=ATOL)


def test_flute_init_is_small_gaussian():
  _, data = problem()
  state = fr.init_state(fr.Flute(rep_dim=K), data, hparams(), jax.random.key(0))
  alpha = 1 / (10 * D)
  for x in (state.B, state.heads):
    assert abs(float(jnp.std(x)) / alpha - 1) < 0.5 and abs(float(jnp.mean(x))) < alpha
  ri = fr.make_algorithm("fedrep-ri", rep_dim=K, cohort=M)
  B0 = fr.init_state(ri, data, hparams(), jax.random.key(0)).B
  assert ri.init_method == "gaussian" and float(jnp.max(jnp.abs(B0))) < 5 * alpha


def flute_objective(B, heads, X, y, scale, gamma1, gamma2):
  losses = scale * jnp.mean((jnp.einsum("cmd,dk,ck->cm", X, B, heads) - y) ** 2, axis=1)
  return jnp.sum(losses) + fr.regularizer(B, heads, gamma1, gamma2)


@pytest.mark.parametrize("loss", list(LOSSES))
def test_flute_step_is_gradient_descent_on_the_regularised_objective(loss):
  _, data = problem()
  algorithm = fr.Flute(rep_dim=K, loss=loss)
  state = fr.init_state(algorithm, data, hparams(), jax.random.key(1))
  state = state.replace(B=state.B * 30, heads=state.heads * 30)  # away from zero
  lr = 0.01
  new_state, _ = jax.jit(algorithm.round)(state, jax.random.key(2), data, hparams(lr))
  grad_B, grad_heads = jax.grad(flute_objective, argnums=(0, 1))(
      state.B, state.heads, data.X, data.y, LOSSES[loss], 0.25, 0.125)
  np.testing.assert_allclose(new_state.B, state.B - lr * grad_B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(new_state.heads, state.heads - lr * grad_heads, rtol=RTOL,
                             atol=ATOL)


def test_regularizer_with_gamma1_twice_gamma2_is_the_balance_term():
  key_b, key_w = jax.random.split(jax.random.key(3))
  B, heads = jax.random.normal(key_b, (D, K)), jax.random.normal(key_w, (M, K))
  gamma2 = 0.3
  balance = lambda B, heads: gamma2 * jnp.sum((B.T @ B - heads.T @ heads) ** 2)
  np.testing.assert_allclose(fr.regularizer(B, heads, 2 * gamma2, gamma2), balance(B, heads),
                             rtol=1e-5)
  for ours, expected in zip(fr.regularizer_grads(B, heads, 2 * gamma2, gamma2),
                            jax.grad(balance, argnums=(0, 1))(B, heads)):
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedrep", "fedrep-ri", "flute"])
def test_padded_datasets_give_the_unpadded_run(name):
  """N real samples padded to more rows (counts) run exactly as the unpadded data."""
  _, padded = problem(pad_to=13)
  unpadded = padded.replace(X=padded.X[:, :N], y=padded.y[:, :N], counts=None)
  algorithm = fr.make_algorithm(name, rep_dim=K, cohort=M)
  runs = [fr.run(algorithm, data, hparams(0.05), jax.random.key(5), ROUNDS, progress=False)
          for data in (padded, unpadded)]
  np.testing.assert_allclose(runs[0].state.B, runs[1].state.B, rtol=RTOL, atol=ATOL)
  for metric in ("model_error", "train_loss"):
    np.testing.assert_allclose(runs[0].metrics[metric], runs[1].metrics[metric], rtol=RTOL,
                               atol=ATOL)


def test_ragged_fedrep_and_moments_match_reference():
  """Clients with different numbers of samples: per-client 1/m_i in FedRep and the MoM."""
  _, full = problem(samples=12)
  counts = jnp.array([3, 12, 7, 5, 12, 9, 4, 6, 10])
  data = fr.client_data(full.X, full.y, B_star=full.B_star, counts=counts)
  Xs, ys = real_rows(data)
  B0 = fr.method_of_moments(data.X, data.y, K, data.counts)
  assert float(fr.principal_angle(B0, jnp.asarray(ref.method_of_moments(Xs, ys, K),
                                                  jnp.float32))) < 1e-3
  algorithm = fr.FedRep(rep_dim=K, cohort=M)
  key = jax.random.key(6)
  state0 = fr.init_state(algorithm, data, hparams(), key)
  result = fr.run(algorithm, data, hparams(0.05), key, ROUNDS, progress=False)
  B, heads = np.asarray(state0.B), np.asarray(state0.heads)
  for _ in range(ROUNDS):
    B, heads, _ = ref.fedrep_round(B, heads, Xs, ys, range(M), 0.05)
  np.testing.assert_allclose(result.state.B, B, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_divergence_is_flagged_and_the_rest_of_the_sweep_goes_on():
  _, data = problem(seed=2, kind="linear")
  algorithm = fr.Flute(rep_dim=K, loss="mean")
  lrs = jnp.array([0.005, 0.3], jnp.float32)
  swept = fr.run(algorithm, data, fr.LinearHparams(lr=lrs, head_lr=lrs), jax.random.key(0), 40,
                 sweep_axes=(None, 0, None), chunk=16, progress=False)
  diverged = swept.metrics["diverged"]
  assert not diverged[0].any()
  first = int(np.argmax(diverged[1]))
  assert 0 < first and diverged[1, first:].all() and not diverged[1, :first].any()
  assert np.isnan(swept.metrics["model_error"][1, first:]).all()
  assert np.isfinite(swept.metrics["model_error"][1, :first]).all()
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(swept.state))
  stable = fr.run(algorithm, data, hparams(0.005), jax.random.key(0), 40, progress=False)
  np.testing.assert_allclose(swept.state.B[0], stable.state.B, rtol=RTOL, atol=ATOL)
  last_finite = fr.run(algorithm, data, hparams(0.3), jax.random.key(0), first, progress=False)
  np.testing.assert_allclose(swept.state.B[1], last_finite.state.B, rtol=RTOL, atol=ATOL)


def test_flute_does_not_recompile(compiles):
  algorithm = fr.Flute(rep_dim=K)
  datas = [problem(seed)[1] for seed in (0, 1)]
  hps = [hparams(0.01), hparams(0.02, reg_lr=0.01, gamma1=0.2, gamma2=0.1)]
  keys = [jax.random.key(0), jax.random.key(1)]
  fr.run(algorithm, datas[0], hps[1], keys[0], 10, chunk=5, progress=False)
  compiles.reset()
  fr.run(algorithm, datas[1], hps[1], keys[1], 10, chunk=5, progress=False)
  assert compiles.count == 0
