"""FedRoD and FedBABU against the numpy reference (rod_babu_reference): rounds, evaluation,
the balanced softmax on absent classes and padding, FedBABU's frozen head and fine-tuning,
no recompiles and bad options; test_nn_reference's MLP, data and rounds."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_rep as fr
from fedjax_rep.nn import fedrod
import nn_reference as ref
import rod_babu_reference as rod_ref
from test_nn_reference import (ATOL, HP, ROUNDS, RTOL, STRUCTURE, assert_states_close,
                               from_reference, initial_state, jitted, make, make_data,
                               run_package, to_reference)

FT_EPOCHS = 2
KEY = jax.random.key(3)
NAMES = ("fedrod", "fedbabu")


def make_alg(name):
  return make(name, ft_epochs=FT_EPOCHS)


def babu_hparams(ft_body):
  """HP with FedBABU's flag babu_ft_body (1 or 0: fine-tune body and head, or the head)."""
  return HP.replace(options=fr.nn_hparams(babu_ft_body=int(ft_body)).options)


def run_reference(name, shared, personal, data, key=KEY, rounds=ROUNDS):
  losses = []
  for t, (clients, mask) in enumerate(rounds):
    shared, personal, loss = rod_ref.masked_round(
        name, shared, personal, jax.random.fold_in(key, t), data, HP, clients, mask,
        local_epochs=STRUCTURE["local_epochs"], batch_size=STRUCTURE["batch_size"])
    losses.append(loss)
  return shared, personal, losses


def trained_state(algorithm, data):
  """The package's state holding the params of the reference's ROUNDS (the package's rounds
  agree with them, tested below, so evaluation compiles alone)."""
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  shared, personal, _ = run_reference(algorithm.name, shared, personal, data)
  return from_reference(state, shared, personal)


def client_keys(state, n):
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
      jax.random.wrap_key_data(state.eval_key), jnp.arange(n))


def numeric_gradient(loss, params, names, eps=1e-6):
  """Central differences of loss(params) w.r.t. the params `names`."""
  grads = {}
  for p in names:
    grads[p] = np.zeros_like(params[p])
    for j in np.ndindex(params[p].shape):
      plus, minus = {**params, p: params[p].copy()}, {**params, p: params[p].copy()}
      plus[p][j] += eps
      minus[p][j] -= eps
      grads[p][j] = (loss(plus) - loss(minus)) / (2 * eps)
  return grads


def test_reference_gradients_match_finite_differences():
  """The balanced softmax's gradient (class 0 absent: count 0) over the model and the
  personalised CE's over the personal head."""
  rng = np.random.default_rng(0)
  model = {"body/fc1/kernel": rng.normal(size=(6, 5)), "body/fc1/bias": rng.normal(size=5),
           "body/fc2/kernel": rng.normal(size=(5, 4)), "body/fc2/bias": rng.normal(size=4),
           "head/kernel": rng.normal(size=(4, 3)), "head/bias": rng.normal(size=3)}
  own = {"personal/head/kernel": rng.normal(size=(4, 3)),
         "personal/head/bias": rng.normal(size=3)}
  x, y, counts = rng.normal(size=(7, 6)), rng.integers(1, 3, 7), np.array([0.0, 4.0, 9.0])
  _, grads = rod_ref.balanced_loss_and_grads(model, x, y, counts)
  numeric = numeric_gradient(lambda m: rod_ref.balanced_loss_and_grads(m, x, y, counts)[0],
                             model, list(model))
  _, own_grads = rod_ref.personal_loss_and_grads(model, own, x, y)
  own_numeric = numeric_gradient(lambda o: rod_ref.personal_loss_and_grads(model, o, x, y)[0],
                                 own, list(own))
  for p, g in {**numeric, **own_numeric}.items():
    np.testing.assert_allclose({**grads, **own_grads}[p], g, rtol=1e-5, atol=1e-8, err_msg=p)
  assert np.all(np.isfinite(grads["head/bias"])) and grads["head/bias"][0] == 0.0


def test_balanced_softmax_is_ce_of_logits_shifted_by_log_counts():
  logits = jnp.array([[0.3, -1.0, 2.0], [1.5, 0.2, -0.4], [0.0, 0.0, 1.0]])
  labels, counts = jnp.array([2, 0, 1]), jnp.array([3.0, 1.0, 5.0])
  weights = jnp.array([1.0, 1.0, 0.0])
  shifted = optax.softmax_cross_entropy_with_integer_labels(logits + jnp.log(counts), labels)
  balanced = jax.jit(fedrod.balanced_cross_entropy)(logits, labels, weights, counts)
  np.testing.assert_allclose(balanced, (shifted[0] + shifted[1]) / 2, rtol=1e-6)


def test_balanced_softmax_without_class_0_and_padding_stays_finite():
  """A client with no sample of class 0 (count 0: log 0 = -inf) whose padding rows (weight
  0) have label 0: the loss and its gradient are the real rows' (the reference's), finite,
  and 0 for the padding rows and the absent class."""
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(6, 4)).astype(np.float32)
  labels = np.array([1, 3, 1, 2, 0, 0])
  weights = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0], np.float32)
  counts = np.array([0.0, 2.0, 1.0, 1.0], np.float32)

  def loss(z):
    return fedrod.balanced_cross_entropy(z, jnp.asarray(labels), jnp.asarray(weights),
                                         jnp.asarray(counts))

  value, grad = jax.jit(jax.value_and_grad(loss))(jnp.asarray(logits))
  real = logits[:4].astype(np.float64)
  with np.errstate(divide="ignore"):
    shifted = real + np.log(counts.astype(np.float64))
  expected_grad = (ref.softmax(shifted) - rod_ref.one_hot(labels[:4], 4)) / 4
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  np.testing.assert_allclose(value, ref.cross_entropy(shifted, labels[:4]), rtol=RTOL)
  np.testing.assert_allclose(grad[:4], expected_grad, rtol=RTOL, atol=ATOL)
  assert np.all(grad[4:] == 0.0) and np.all(grad[:, 0] == 0.0)


def test_fedrod_round_with_a_client_without_class_0_matches_reference():
  """A hand-made case: client 0 has no sample of class 0 (its 7 real rows relabelled 0 -> 1)
  and 7 padding rows of label 0; a round of its cohort stays finite and matches the
  reference (the data's shapes are those of the rounds below: one compile serves both)."""
  data = make_data()
  y = np.array(data.y)
  y[0, :7] = np.where(y[0, :7] == 0, 1, y[0, :7])
  data = data.replace(y=jnp.asarray(y))
  assert int(data.counts[0]) == 7 and np.all(y[0, 7:] == 0) and not np.any(y[0, :7] == 0)
  algorithm = make_alg("fedrod")
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  rounds = ROUNDS[:1]
  assert 0 in rounds[0][0]
  state, losses = run_package(algorithm, state, data, KEY, rounds)
  shared, personal, ref_losses = run_reference("fedrod", shared, personal, data, KEY, rounds)
  assert all(np.all(np.isfinite(v)) for v in [*state.shared.values(),
                                              *state.personal.values()])
  assert_states_close(state, shared, personal)
  np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", NAMES)
def test_rounds_match_reference(name):
  data = make_data()
  algorithm = make_alg(name)
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  state, losses = run_package(algorithm, state, data, KEY)
  shared, personal, ref_losses = run_reference(name, shared, personal, data)
  assert_states_close(state, shared, personal)
  np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)


def test_fedbabu_head_keeps_its_initial_bits():
  data = make_data()
  algorithm = make_alg("fedbabu")
  initial = initial_state(algorithm, data)
  state, _ = run_package(algorithm, initial, data, KEY)  # compiled by the test above
  for p, v in state.shared.items():
    if p.startswith("head/"):
      assert np.array_equal(v, initial.shared[p]), p
    else:
      assert np.abs(v - initial.shared[p]).max() > 100 * ATOL, p


def test_fedrod_tests_with_generic_plus_personal_logits():
  """The logits of what `evaluate` tests each client with are g + p (the reference's)."""
  data = make_data()
  algorithm = make_alg("fedrod")
  state = trained_state(algorithm, data)
  keys = client_keys(state, data.num_clients)
  logits = jax.jit(jax.vmap(lambda personal, x, y, count, key, x_test: algorithm.logits(
      algorithm.eval_params(state.shared, personal, x, y, count, key, HP), x_test)))(
          state.personal, data.x, data.y, data.counts, keys, data.x_test)
  shared, personal = to_reference(state, data.num_clients)
  for i in range(data.num_clients):
    expected = rod_ref.rod_logits(shared, personal[i], np.asarray(data.x_test[i], np.float64))
    np.testing.assert_allclose(logits[i], expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("ft_body", [True, False])
def test_fedbabu_fine_tuned_params_match_reference(ft_body):
  data = make_data()
  algorithm = make_alg("fedbabu")
  state = trained_state(algorithm, data)
  hp = babu_hparams(ft_body)
  tuned = jax.jit(jax.vmap(lambda x, y, count, key: algorithm.eval_params(
      state.shared, {}, x, y, count, key, hp)))(data.x, data.y, data.counts,
                                                client_keys(state, data.num_clients))
  shared, _ = to_reference(state, data.num_clients)
  for i in range(data.num_clients):
    expected = rod_ref.fine_tuned(shared, data, i, HP, ft_epochs=FT_EPOCHS, ft_body=ft_body,
                                  eval_key=state.eval_key, batch_size=STRUCTURE["batch_size"])
    assert set(tuned) == set(expected)
    for p, v in tuned.items():
      np.testing.assert_allclose(v[i], expected[p], rtol=RTOL, atol=ATOL, err_msg=p)
      if p.startswith("body/") and not ft_body:
        assert np.array_equal(v[i], state.shared[p]), p


@pytest.mark.parametrize("name", NAMES)
def test_evaluation_matches_reference(name):
  data = make_data()
  algorithm = make_alg(name)
  state = trained_state(algorithm, data)
  metrics = jitted(algorithm, "evaluate")(state, data, HP)
  shared, personal = to_reference(state, data.num_clients)
  expected = rod_ref.evaluate(name, shared, personal, data, HP, ft_epochs=FT_EPOCHS,
                              ft_body=True, eval_key=state.eval_key,
                              batch_size=STRUCTURE["batch_size"])
  for metric in ("test_accuracy", "test_accuracy_std"):
    np.testing.assert_allclose(float(metrics[metric]), expected[metric], atol=1e-6,
                               err_msg=metric)


@pytest.mark.slow
def test_fedbabu_new_clients_fine_tune_the_global_model():
  """New clients fine-tune the global model, frozen head included, as evaluation does
  (client i with key fold_in(key, i))."""
  data, new = make_data(), make_data(seed=5)
  algorithm = make_alg("fedbabu")
  state = trained_state(algorithm, data)
  key = jax.random.key(7)
  metrics = jax.jit(algorithm.new_clients, static_argnums=4)(state, new, HP, key, FT_EPOCHS)
  shared, personal = to_reference(state, new.num_clients)
  expected = rod_ref.evaluate("fedbabu", shared, personal, new, HP, ft_epochs=FT_EPOCHS,
                              ft_body=True, eval_key=jax.random.key_data(key),
                              batch_size=STRUCTURE["batch_size"])
  for metric in ("test_accuracy", "test_accuracy_std"):
    np.testing.assert_allclose(float(metrics[metric]), expected[metric], atol=1e-6,
                               err_msg=metric)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_rounds_and_evaluation_compile_once_across_keys_data_and_hparams(name, compiles):
  algorithm = make_alg(name)
  runs = [(make_data(), HP, jax.random.key(0)),
          (make_data(seed=1), fr.nn_hparams(lr=0.05, momentum=0.3, weight_decay=1e-4),
           jax.random.key(1))]
  for run, (data, hp, key) in enumerate(runs):
    if run:  # the first run compiles (unless the tests above did)
      compiles.reset()
    state = algorithm.init(key, data, hp)
    state, _ = jitted(algorithm, "masked_round")(state, key, data, hp,
                                                 jnp.asarray(ROUNDS[1][0]),
                                                 jnp.asarray(ROUNDS[1][1]))
    jitted(algorithm, "evaluate")(state, data, hp)
  assert compiles.count == 0


@pytest.mark.parametrize("options, traced, message", [
    ({}, dict(babu_ft_body=np.float32(0.5)),
     r"babu_ft_body=0.5 is out of range: babu_ft_body must be 0 or 1"),
    (dict(ft_epochs=-1), {}, r"ft_epochs=-1 must be an integer >= 0"),
])
def test_bad_fedbabu_options_fail_before_any_compile(options, traced, message, compiles):
  algorithm = dataclasses.replace(make_alg("fedbabu"), **options)
  data, key = make_data(), jax.random.key(0)
  compiles.reset()  # building the data and the key may compile; only the run must not
  with pytest.raises(ValueError, match=message):
    fr.run(algorithm, data, HP.replace(options=traced), key, 1, progress=False)
  assert compiles.count == 0
