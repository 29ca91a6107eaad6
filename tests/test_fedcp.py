"""FedCP (fedjax_rep/nn/fedcp.py) against its numpy reference (cp_reference): the
reference's gradients against finite differences, the policy's masks and the MMD term on
hand-made cases, whole rounds and evaluation on test_nn_reference's MLP, data and rounds
(float32 tolerance), one compile across keys, data and hparams, and bad options."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.nn import fedcp
from fedjax_rep.nn import hparams as hparams_lib
import cp_reference as cp_ref
from test_nn_reference import (ATOL, HP, ROUNDS, RTOL, STRUCTURE, assert_states_close,
                               from_reference, initial_state, jitted, make, make_data,
                               run_package, to_reference)

LAMBDA = 5.0  # the authors' (and the default): the MMD term moves the params far, see below
KEY = jax.random.key(3)


def run_reference(shared, personal, data, key, fedcp_lambda=LAMBDA):
  losses = []
  for t, (clients, mask) in enumerate(ROUNDS):
    shared, personal, loss = cp_ref.masked_round(
        shared, personal, jax.random.fold_in(key, t), data, HP, clients, mask,
        local_epochs=STRUCTURE["local_epochs"], batch_size=STRUCTURE["batch_size"],
        fedcp_lambda=fedcp_lambda)
    losses.append(loss)
  return shared, personal, losses


def test_reference_gradients_match_finite_differences():
  rng = np.random.default_rng(0)
  shapes = {"body/fc1/kernel": (6, 5), "body/fc1/bias": (5,), "body/fc2/kernel": (5, 4),
            "body/fc2/bias": (4,), "head/kernel": (4, 3), "head/bias": (3,),
            "global_head/kernel": (4, 3), "global_head/bias": (3,), "cpn/fc/kernel": (4, 8),
            "cpn/fc/bias": (8,), "cpn/norm/scale": (8,), "cpn/norm/bias": (8,)}
  params = {p: rng.normal(size=s) for p, s in shapes.items()}
  frozen = {p: v + 0.3 * rng.normal(size=v.shape) for p, v in params.items()
            if p.startswith("body/")}
  x, y = rng.normal(size=(7, 6)), rng.integers(0, 3, 7)
  c, noise = cp_ref.context(rng.normal(size=(4, 3))), rng.gumbel(size=(7, 2, 4))

  def total(p):
    return cp_ref.objective(p, x, y, c, noise, 3.0, frozen)[1]

  _, _, grads = cp_ref.objective(params, x, y, c, noise, 3.0, frozen)
  assert set(grads) == {p for p in params if not p.startswith("global_head/")}
  eps = 1e-6
  for p, g in grads.items():
    numeric = np.zeros_like(g)
    for j in np.ndindex(g.shape):
      plus, minus = {**params, p: params[p].copy()}, {**params, p: params[p].copy()}
      plus[p][j] += eps
      minus[p][j] -= eps
      numeric[j] = (total(plus) - total(minus)) / (2 * eps)
    np.testing.assert_allclose(g, numeric, rtol=1e-5, atol=1e-8, err_msg=p)
  _, dx = cp_ref.mmd(x, x + 1.0)  # the MMD's own gradient (its weight above is 3)
  assert np.abs(dx).max() > 1e-3


def test_policy_masks_on_a_hand_made_case():
  """Context [3, 4] / 5 of the head, features [5, 5]: policy inputs [3, 4], the CPN's fc
  gives [3, -1, -1, -1] (mean 0, variance 3), LayerNorm and ReLU [3 / sqrt(3 + eps), 0 | 0,
  0]; with noise [0.5, 0 | 0, -1] the personal mask is sigmoid of t_p - t_g."""
  flat = {"head/kernel": jnp.array([[1.0, 2.0], [0.0, 4.0]]),
          "cpn/fc/kernel": jnp.array([[1.0, 0.0, 0.0, 0.0], [0.0, -0.25, -0.25, -0.25]]),
          "cpn/fc/bias": jnp.zeros(4), "cpn/norm/scale": jnp.ones(4),
          "cpn/norm/bias": jnp.zeros(4)}
  h = jnp.array([[5.0, 5.0]])
  noise = np.array([[[0.5, 0.0], [0.0, -1.0]]])
  top = 3.0 / math.sqrt(3.0 + 1e-5)
  sigmoid = lambda t: 1.0 / (1.0 + math.exp(-t))
  expected = np.array([[sigmoid(top + 0.5), sigmoid(1.0)]])
  c = fedcp.context(flat)
  np.testing.assert_allclose(c, [0.6, 0.8], rtol=1e-6)
  scores = make("fedcp").policy(flat, h, c)
  np.testing.assert_allclose(scores, [[[top, 0.0], [0.0, 0.0]]], rtol=1e-6, atol=1e-7)
  personal, global_ = fedcp.masks(scores, jnp.asarray(noise, jnp.float32))
  np.testing.assert_allclose(personal, expected, rtol=1e-6)
  np.testing.assert_allclose(global_, 1.0 - expected, rtol=1e-6)
  np.testing.assert_allclose(fedcp.masks(scores, jnp.zeros((1, 2, 2)))[0],
                             [[sigmoid(top), 0.5]], rtol=1e-6)
  numpy_flat = {p: np.asarray(v, np.float64) for p, v in flat.items()}
  ref_c = cp_ref.context(numpy_flat["head/kernel"])
  ref_scores, _ = cp_ref.policy_forward(numpy_flat, np.asarray(h, np.float64) * ref_c)
  np.testing.assert_allclose(cp_ref.masks(ref_scores, noise)[0], expected, rtol=1e-12)


def test_mmd_on_a_hand_made_case():
  """One real row each, x_0 = 0 and y_0 = [1, 1] (squared distance 2): MMD^2 = K(0) + K(0)
  - 2 K(2) = 8 - 2 sum_a exp(-1 / a); the padding row (weight 0) does not count."""
  x, y = np.array([[0.0, 0.0], [9.0, 9.0]]), np.array([[1.0, 1.0], [-7.0, 3.0]])
  expected = 8.0 - 2.0 * sum(math.exp(-1.0 / a) for a in (10, 15, 20, 50))
  np.testing.assert_allclose(fedcp.mmd(jnp.asarray(x), jnp.asarray(y), jnp.array([1.0, 0.0])),
                             expected, rtol=1e-6)
  np.testing.assert_allclose(cp_ref.mmd(x[:1], y[:1])[0], expected, rtol=1e-12)
  assert float(fedcp.mmd(jnp.asarray(x), jnp.asarray(x), jnp.ones(2))) == pytest.approx(
      0.0, abs=1e-6)
  assert float(fedcp.mmd(jnp.asarray(x), jnp.asarray(y), jnp.zeros(2))) == 0.0


def test_rounds_match_reference():
  data = make_data()
  algorithm = make("fedcp")  # fedcp_lambda: LAMBDA, the default
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  state, losses = run_package(algorithm, state, data, KEY)
  ref_shared, ref_personal, ref_losses = run_reference(shared, personal, data, KEY)
  assert_states_close(state, ref_shared, ref_personal)
  np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)
  # the alignment term is decisive: without it the body moves far beyond the tolerance
  unaligned, _, _ = run_reference(shared, personal, data, KEY, fedcp_lambda=0.0)
  assert max(np.abs(unaligned[p] - ref_shared[p]).max() for p in ref_shared) > 1e3 * ATOL


def test_evaluation_matches_reference():
  """Every client's test logits (eval_params, then logits: its Gumbel noise from its
  evaluation key) and evaluate's metrics, of a state trained by the reference's rounds."""
  data = make_data()
  algorithm = make("fedcp")  # fedcp_lambda: LAMBDA, the default
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  shared, personal, _ = run_reference(shared, personal, data, KEY)
  state = from_reference(state, shared, personal)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
      jax.random.wrap_key_data(state.eval_key), jnp.arange(data.num_clients))
  tested = jax.jit(jax.vmap(lambda personal, x, y, count, key, x_test: algorithm.logits(
      algorithm.eval_params(state.shared, personal, x, y, count, key, HP), x_test)))(
          state.personal, data.x, data.y, data.counts, keys, data.x_test)
  for i in range(data.num_clients):
    np.testing.assert_allclose(tested[i], cp_ref.test_logits(shared, personal[i], data, i,
                                                             state.eval_key),
                               rtol=RTOL, atol=ATOL, err_msg=f"client {i}")
  metrics = jitted(algorithm, "evaluate")(state, data, HP)
  expected = cp_ref.evaluate(shared, personal, data, state.eval_key)
  for metric in ("test_accuracy", "test_accuracy_std"):
    np.testing.assert_allclose(float(metrics[metric]), expected[metric], atol=1e-6,
                               err_msg=metric)


def test_rounds_and_evaluation_compile_once(compiles):
  algorithm = make("fedcp")  # fedcp_lambda: LAMBDA, the default
  data = make_data()
  state = initial_state(algorithm, data)
  run_package(algorithm, state, data, KEY)  # compiled here unless an earlier test did
  jitted(algorithm, "evaluate")(state, data, HP)
  other, hp = make_data(seed=1), hparams_lib.hparams(lr=0.05, momentum=0.9, weight_decay=0.0)
  state = initial_state(algorithm, other)
  compiles.reset()
  step = jitted(algorithm, "masked_round")
  for t, (clients, mask) in enumerate(ROUNDS):
    state, _ = step(state, jax.random.fold_in(jax.random.key(7), t), other, hp,
                    jnp.asarray(clients), jnp.asarray(mask))
  jitted(algorithm, "evaluate")(state, other, hp)
  assert compiles.count == 0, compiles.names


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_bad_lambda_fails_before_any_compile(value, compiles):
  algorithm = make("fedcp")
  data, key = make_data(), jax.random.key(0)
  compiles.reset()  # building the data and the key may compile; only the run must not
  with pytest.raises(ValueError, match=r"fedcp_lambda.* (must be finite and >= 0|is not finite)"):
    fr.run(algorithm, data, HP.replace(options={"fedcp_lambda": np.float32(value)}), key, 1,
           progress=False)
  assert compiles.count == 0
