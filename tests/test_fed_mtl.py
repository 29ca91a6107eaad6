"""Fed-MTL (`nn.fed_mtl`) against the numpy reference (mtl_reference): the regulariser's
gradient for each Omega and the default lambda, whole rounds with a masked client,
evaluation, no recompile across data, keys and lambdas, and bad options refused before any
compile (sharded rounds: test_nn_sharding)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.nn import fed_mtl
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import params as params_lib
import mtl_reference as mtl
import nn_reference as ref
from test_nn_reference import (ATOL, ROUNDS, RTOL, STRUCTURE, assert_states_close,
                               from_reference, initial_state, jitted, make, make_data,
                               to_reference)

LAMBDA = 0.05  # decisive: moves the params far beyond the tolerance (tested)
HP = hparams_lib.hparams(lr=0.1, momentum=0.5, weight_decay=1e-3, mtl_lambda=LAMBDA)
KEY = jax.random.key(3)


def run_package(algorithm, state, data, hp, key, rounds=ROUNDS):
  """The package's state and train losses after `rounds` of the jitted masked_round."""
  step = jitted(algorithm, "masked_round")
  losses = []
  for t, (clients, mask) in enumerate(rounds):
    state, metrics = step(state, jax.random.fold_in(key, t), data, hp, jnp.asarray(clients),
                          jnp.asarray(mask))
    losses.append(float(metrics["train_loss"]))
  return state, losses


def run_reference(personal, data, key):
  """The reference's personal params and train losses after ROUNDS with lambda LAMBDA."""
  losses = []
  for t, (clients, mask) in enumerate(ROUNDS):
    personal, loss = mtl.mtl_round(personal, jax.random.fold_in(key, t), data, HP, clients,
                                   mask, lam=LAMBDA, local_epochs=STRUCTURE["local_epochs"],
                                   batch_size=STRUCTURE["batch_size"])
    losses.append(loss)
  return personal, losses


def random_columns(m, seed=0):
  """m random models shaped like the MLP's params (flat float64 dicts)."""
  state = jax.eval_shape(make("fed-mtl").init, jax.random.key(0), make_data(), HP)
  rng = np.random.default_rng(seed)
  return [{p: rng.normal(size=v.shape[1:]) for p, v in state.personal.items()}
          for _ in range(m)]


@pytest.mark.parametrize("kind", fed_mtl.OMEGAS)
def test_reference_regulariser_gradient_matches_finite_differences(kind):
  rng = np.random.default_rng(0)
  w, om, eps = rng.normal(size=(5, 3)), mtl.omega(kind, 3), 1e-6
  for j in range(3):
    numeric = np.zeros(5)
    for r in range(5):
      plus, minus = w.copy(), w.copy()
      plus[r, j] += eps
      minus[r, j] -= eps
      numeric[r] = (mtl.regulariser(plus, 0.7, om) - mtl.regulariser(minus, 0.7, om)) / (2 * eps)
    np.testing.assert_allclose(mtl.regulariser_grad(w, j, 0.7, om), numeric, rtol=1e-6,
                               atol=1e-8)


@pytest.mark.parametrize("kind", fed_mtl.OMEGAS)
@pytest.mark.parametrize("m", [1, 2, 5])
def test_omega_coefficients_give_the_reference_omega(kind, m):
  a, b = fed_mtl.omega_coefficients(kind, m)
  np.testing.assert_allclose(a * np.eye(m) + b * np.ones((m, m)), mtl.omega(kind, m),
                             atol=1e-12)


def test_eye_omega_is_the_elementwise_square():
  np.testing.assert_allclose(mtl.omega("eye", 4), np.where(np.eye(4), 0.75**2, 1 / 16))


@pytest.mark.parametrize("kind,hp,lam", [
    ("eye", HP, LAMBDA), ("ones", HP, LAMBDA), ("centering", HP, LAMBDA),
    ("eye", hparams_lib.hparams(), mtl.authors_lambda(6570))])  # the MLP's p: 6570
def test_regulariser_gradient_matches_reference(kind, hp, lam):
  """The package's gradient in column j (its other columns summed) equals the reference's
  with W and Omega explicit; without mtl_lambda, lambda is the authors' scale for p."""
  columns, j = random_columns(4), 2
  algorithm = make("fed-mtl")
  hp = hp.replace(options={**hp.options, **hparams_lib.hparams(mtl_omega=kind).options})
  others = {p: sum(c[p] for i, c in enumerate(columns) if i != j) for p in columns[j]}
  grads = jax.jit(jax.grad(algorithm.regulariser))(columns[j], others, 4.0, hp)
  w = np.stack([mtl.column(c) for c in columns], axis=1)
  expected = mtl.regulariser_grad(w, j, lam, mtl.omega(kind, 4))
  np.testing.assert_allclose(mtl.column(grads), expected, rtol=RTOL, atol=lam * ATOL)


def test_w_leaves_out_only_the_embedding():
  model = fr.make_model("sent140-lstm", vocab_size=30)
  flat = params_lib.flatten(jax.eval_shape(model.init, jax.random.key(0),
                                           jnp.zeros((1, 25), jnp.int32))["params"])
  assert sorted(fed_mtl.regularised(flat)) == mtl.names(flat) == sorted(
      p for p in flat if p != "body/embed/embedding")


@pytest.mark.parametrize("p", [1, 9, 10, 999, 1000, 6570, 10**6 - 1, 10**6])
def test_default_lambda_is_the_authors_scale(p):
  assert fed_mtl.default_lambda(p) == mtl.authors_lambda(p) == 10.0**-(
      math.floor(math.log10(p)) + 2)


def test_rounds_match_reference():
  data = make_data()
  algorithm = make("fed-mtl")
  state = initial_state(algorithm, data)
  _, personal = to_reference(state, data.num_clients)
  state, losses = run_package(algorithm, state, data, HP, KEY)
  personal, ref_losses = run_reference(personal, data, KEY)
  assert state.shared == {}
  assert_states_close(state, {}, personal)
  np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)


def test_no_recompile_across_data_keys_and_lambdas_and_lambda_is_decisive(compiles):
  data = make_data()
  algorithm = make("fed-mtl")
  state = initial_state(algorithm, data)
  decisive, _ = run_package(algorithm, state, data, HP, KEY)
  compiles.reset()
  without, _ = run_package(algorithm, state, data, HP.replace(
      options={"mtl_lambda": jnp.float32(0.0)}), KEY)
  other = make_data(seed=1)
  other_hp = hparams_lib.hparams(lr=0.05, momentum=0.3, weight_decay=0.0, mtl_lambda=0.2)
  run_package(algorithm, initial_state(algorithm, other), other, other_hp, jax.random.key(5))
  assert compiles.count == 0
  moved = max(float(jnp.max(jnp.abs(decisive.personal[p] - without.personal[p])))
              for p in state.personal)
  assert moved > 100 * ATOL


def test_a_fully_masked_round_changes_nothing():
  data = make_data()
  algorithm = make("fed-mtl")
  state = initial_state(algorithm, data)
  rounds = [(np.array([1, 2, 3, 4]), np.array([False] * 4))]
  new_state, losses = run_package(algorithm, state, data, HP, KEY, rounds)
  assert losses == [0.0]
  assert_states_close(new_state, {}, to_reference(state, data.num_clients)[1])


def test_evaluation_matches_reference():
  """Each client is tested with its own model (the reference's rounds' params)."""
  data = make_data()
  algorithm = make("fed-mtl")
  state = initial_state(algorithm, data)
  _, personal = to_reference(state, data.num_clients)
  personal, _ = run_reference(personal, data, KEY)
  state = from_reference(state, {}, personal)
  metrics = jitted(algorithm, "evaluate")(state, data, HP)
  expected = ref.evaluate({}, personal, data)
  for metric in ("test_accuracy", "test_accuracy_std"):
    np.testing.assert_allclose(float(metrics[metric]), expected[metric], atol=1e-6,
                               err_msg=metric)


@pytest.mark.parametrize("options, message", [
    ({"mtl_lambda": -0.5}, r"mtl_lambda = -0.5 is out of range: it must be finite and >= 0"),
    ({"mtl_lambda": np.nan}, r"mtl_lambda.* is not finite")])
def test_bad_lambda_fails_before_any_compile(options, message, compiles):
  """A lambda that hparams() would refuse, given another way (NNHparams itself)."""
  hp = HP.replace(options={k: jnp.float32(v) for k, v in options.items()})
  data, key = make_data(), jax.random.key(0)
  compiles.reset()  # building the data and the key may compile; only the run must not
  with pytest.raises(ValueError, match=message):
    fr.run(make("fed-mtl"), data, hp, key, 1, progress=False)
  assert compiles.count == 0


@pytest.mark.parametrize("build, message", [
    (lambda: hparams_lib.hparams(mtl_lambda=-1.0),
     r"mtl_lambda=-1.0 is out of range: mtl_lambda must be finite and >= 0"),
    (lambda: hparams_lib.hparams(mtl_lambda=math.inf), r"mtl_lambda=inf is out of range"),
    (lambda: hparams_lib.hparams(mtl_lamda=1.0),
     r"unknown hparams options \['mtl_lamda'\]; known: \[.*'mtl_lambda'.*\]"),
    (lambda: hparams_lib.hparams(mtl_omega="identity"),
     r"mtl_omega='identity' is out of range: mtl_omega must be one of ones, eye, centering")])
def test_bad_options_are_refused(build, message, compiles):
  with pytest.raises(ValueError, match=message):
    build()
  assert compiles.count == 0
