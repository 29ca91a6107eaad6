"""The baselines' rounds and evaluation (FedProx, SCAFFOLD, Ditto, APFL, Per-FedAvg, L2GD
and the "+FT" variants) against the numpy reference (nn_reference), which is written from
their specifications: test_nn_reference's MLP, data and rounds, float32 tolerance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nn_reference as ref
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import algorithms as nn_algorithms
from test_nn_reference import (ATOL, HP, ROUNDS, RTOL, STRUCTURE, assert_states_close,
                               from_reference, initial_state, jitted, make, make_data,
                               run_package, server_and_shared, to_reference)

# Decisive hyperparameters: each term moves the params far beyond the tolerance.
OPTIONS = dict(prox_mu=0.5, ditto_lambda=0.5, apfl_alpha=0.3, maml_inner_lr=0.2,
               l2gd_p=0.4, l2gd_lambda=2.0)
FT_EPOCHS = 2
KEY = jax.random.key(3)
# L2GD: ROUNDS twice; key 4's coins make them a local round, an averaging round with a
# masked client, an averaging round, and a local round with a masked client.
L2GD_ROUNDS = ROUNDS + ROUNDS
L2GD_KEY = jax.random.key(4)
EVALUATED = ("fedprox", "fedprox-ft", "scaffold", "scaffold-ft", "ditto", "apfl",
             "per-fedavg", "l2gd")


def make_baseline(name):
  return make(name, ft_epochs=FT_EPOCHS)


def baseline_hparams(name):
  """HP with the OPTIONS that algorithm `name` declares (its traced numbers)."""
  declared = hparams_lib.declared(nn_algorithms.CLASSES[name])
  return HP.replace(options=hparams_lib.hparams(
      **{k: v for k, v in OPTIONS.items() if k in declared}).options)


def rounds_and_key(name):
  """The rounds [(clients, mask)] and the key that algorithm `name` is tested with."""
  return (L2GD_ROUNDS, L2GD_KEY) if name == "l2gd" else (ROUNDS, KEY)


def run_reference(name, shared, personal, data, key, rounds):
  """The reference's (shared, personal, train losses) after `rounds` of `name` (the "+FT"
  variants train as their base algorithm)."""
  losses = []
  for t, (clients, mask) in enumerate(rounds):
    shared, personal, loss = ref.masked_round(
        name.removesuffix("-ft"), shared, personal, jax.random.fold_in(key, t), data, HP,
        clients, mask, local_epochs=STRUCTURE["local_epochs"],
        batch_size=STRUCTURE["batch_size"], **OPTIONS)
    losses.append(loss)
  return shared, personal, losses


def trained_state(name, data):
  """The package's state of `name` holding the params of the reference's rounds (the
  package's rounds agree with them, tested below, so evaluation compiles alone)."""
  algorithm = make_baseline(name)
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  rounds, key = rounds_and_key(name)
  shared, personal, _ = run_reference(name, shared, personal, data, key, rounds)
  return algorithm, from_reference(state, shared, personal)


def reference_eval_options(name, state):
  """Keyword arguments of the reference's eval_params and evaluate for `name`."""
  return dict(name=name.removesuffix("-ft"),
              ft_epochs=FT_EPOCHS if name.endswith("-ft") else 0, eval_key=state.eval_key,
              batch_size=STRUCTURE["batch_size"], **OPTIONS)


@pytest.mark.parametrize("name", ref.BASELINES)
def test_rounds_match_reference(name):
  data = make_data()
  algorithm = make_baseline(name)
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  rounds, key = rounds_and_key(name)
  state, losses = run_package(algorithm, state, data, key, rounds, baseline_hparams(name))
  shared, personal, ref_losses = run_reference(name, shared, personal, data, key, rounds)
  assert_states_close(state, shared, personal)
  np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)


def test_l2gd_rounds_both_average_and_train_locally():
  """L2GD's rounds above cover both kinds of round, each with and without a masked client."""
  averages = [ref.l2gd_averages(jax.random.fold_in(L2GD_KEY, t), OPTIONS["l2gd_p"])
              for t in range(len(L2GD_ROUNDS))]
  assert averages == [False, True, True, False]
  assert not all(L2GD_ROUNDS[1][1]) and not all(L2GD_ROUNDS[3][1])


def test_scaffold_server_control_is_the_mean_of_the_clients():
  """c = mean_i c_i over all n clients holds at the start (all 0) and every round keeps it
  (c moves by the trained clients' sum of c_i+ - c_i over n, the mean of the c_i by the
  same), masked and unsampled clients included."""
  data = make_data()
  algorithm = make_baseline("scaffold")
  state = algorithm.init(jax.random.key(0), data, HP)
  state, _ = run_package(algorithm, state, data, KEY, ROUNDS, baseline_hparams("scaffold"))
  shared = server_and_shared(state)
  controls = [p for p in shared if p.startswith(ref.CONTROL)]
  assert controls and set(controls) == set(state.personal)
  for p in controls:
    assert np.abs(shared[p]).max() > 100 * ATOL, p
    np.testing.assert_allclose(shared[p], np.mean(state.personal[p], axis=0),
                               rtol=RTOL, atol=ATOL, err_msg=p)


@pytest.mark.parametrize("name", ("fedprox-ft", "scaffold-ft", "ditto", "apfl", "per-fedavg"))
def test_eval_params_match_reference(name):
  """What every client is tested with: the fine-tuned, personal, mixed or adapted params."""
  data = make_data()
  algorithm, state = trained_state(name, data)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
      jax.random.wrap_key_data(state.eval_key), jnp.arange(data.num_clients))
  hp = baseline_hparams(name)
  tested = jax.jit(jax.vmap(lambda personal, x, y, count, key: algorithm.eval_params(
      state.shared, personal, x, y, count, key, hp)))(state.personal, data.x, data.y,
                                                       data.counts, keys)
  shared, personal = to_reference(state, data.num_clients)
  for i in range(data.num_clients):
    expected = ref.eval_params(shared, personal[i], data, i, HP,
                               **reference_eval_options(name, state))
    assert set(tested) == set(expected)
    for p, v in tested.items():
      np.testing.assert_allclose(v[i], expected[p], rtol=RTOL, atol=ATOL, err_msg=p)


@pytest.mark.parametrize("name", EVALUATED)
def test_evaluation_matches_reference(name):
  data = make_data()
  algorithm, state = trained_state(name, data)
  metrics = jitted(algorithm, "evaluate")(state, data, baseline_hparams(name))
  shared, personal = to_reference(state, data.num_clients)
  expected = ref.evaluate(shared, personal, data, HP, **reference_eval_options(name, state))
  for metric in ("test_accuracy", "test_accuracy_std"):
    np.testing.assert_allclose(float(metrics[metric]), expected[metric], atol=1e-6,
                               err_msg=metric)
