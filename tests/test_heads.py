"""Closed-form heads and the principal angle against numpy / scipy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import fedjax_rep as fr
import reference as ref
from fedjax_rep.linear import features


@pytest.mark.parametrize("m,k", [(5, 2), (20, 5), (10, 8), (30, 12), (1, 2), (3, 5)])
def test_least_squares_matches_reference_under_jit_and_vmap(m, k):
  rng = np.random.default_rng(m * 100 + k)
  Z = rng.standard_normal((7, m, k)).astype(np.float32)
  y = rng.standard_normal((7, m)).astype(np.float32)
  solve = jax.jit(jax.vmap(fr.least_squares))
  w = solve(jnp.asarray(Z), jnp.asarray(y))
  expected = [ref.least_squares(Z[i], y[i]) for i in range(7)]
  np.testing.assert_allclose(w, expected, rtol=1e-3, atol=1e-4)
  lstsq = [np.linalg.lstsq(Z[i].astype(np.float64), y[i], rcond=None)[0] for i in range(7)]
  np.testing.assert_allclose(w, lstsq, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("k", [1, 5, 8, 9])
@pytest.mark.parametrize("row_major", [False, True])
def test_k_major_features_match_numpy_under_jit_and_vmap(k, row_major):
  rng = np.random.default_rng(k)
  A = rng.standard_normal((3, 4, 10, 7)).astype(np.float32)  # [runs, c, m, p]
  M = rng.standard_normal((3, 7, k)).astype(np.float32)
  Zt = jax.jit(jax.vmap(lambda A, M: features.k_major(A, M, row_major)))(A, M)
  expected = np.einsum("rcmp,rpk->rkcm", A.astype(np.float64), M.astype(np.float64))
  assert Zt.shape == (3, k, 4, 10)
  np.testing.assert_allclose(Zt, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,k", [(5, 2), (1, 2), (10, 9)])
def test_singular_systems_give_finite_heads(m, k):
  zeros = fr.least_squares(jnp.zeros((m, k)), jnp.ones(m))
  np.testing.assert_array_equal(zeros, 0.0)
  rank_one = jnp.outer(jnp.arange(1.0, m + 1), jnp.ones(k))  # rank-deficient Z
  w = fr.least_squares(rank_one, jnp.arange(1.0, m + 1))
  assert np.all(np.isfinite(w))
  np.testing.assert_allclose(rank_one @ w, jnp.arange(1.0, m + 1), rtol=1e-3)


@pytest.mark.parametrize("k", [2, 5, 8, 11])
def test_solve_spd_both_paths(k):
  rng = np.random.default_rng(k)
  A = rng.standard_normal((4, k, k))
  A = A @ np.swapaxes(A, 1, 2) + k * np.eye(k)
  b = rng.standard_normal((4, k))
  x = fr.solve_spd(jnp.asarray(A, jnp.float32), jnp.asarray(b, jnp.float32))
  np.testing.assert_allclose(x, np.linalg.solve(A, b[..., None])[..., 0], rtol=1e-4, atol=1e-5)


def test_head_gd_matches_reference():
  rng = np.random.default_rng(0)
  Z, y, w0 = rng.standard_normal((6, 3)), rng.standard_normal(6), rng.standard_normal(3)
  w = fr.head_gd(jnp.asarray(Z, jnp.float32), jnp.asarray(y, jnp.float32),
                 jnp.asarray(w0, jnp.float32), 0.1, 7)
  expected = w0.copy()
  for _ in range(7):
    expected = expected - 0.1 * Z.T @ (Z @ expected - y) / 6
  np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d,k,k_star", [(10, 2, 2), (20, 5, 5), (8, 3, 2), (50, 4, 4)])
def test_principal_angle_matches_scipy(d, k, k_star):
  rng = np.random.default_rng(d + k)
  for scale in (1.0, 0.1, 1e-3):  # from far apart to nearly the same subspace
    B_star = rng.standard_normal((d, k_star))
    B = B_star @ rng.standard_normal((k_star, k)) + scale * rng.standard_normal((d, k))
    expected = np.sin(np.max(scipy.linalg.subspace_angles(B, B_star)))
    got = jax.jit(fr.principal_angle)(jnp.asarray(B, jnp.float32),
                                      jnp.asarray(B_star, jnp.float32))
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-5)


def test_principal_angle_is_vmappable():
  rng = np.random.default_rng(0)
  Bs = rng.standard_normal((4, 10, 2)).astype(np.float32)
  B_star = rng.standard_normal((10, 2)).astype(np.float32)
  got = jax.vmap(fr.principal_angle, in_axes=(0, None))(jnp.asarray(Bs), jnp.asarray(B_star))
  expected = [np.sin(np.max(scipy.linalg.subspace_angles(B, B_star))) for B in Bs]
  np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-5)
