"""The evaluation rules on issue 47's case: 20 clients of which 19 have no test samples. The
metrics are those of the one client tested (not diluted by 19 zeros), test_clients is 1,
and the run's check warns, naming the clients without test samples."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.core.loop import split_run_key

N, TESTED = 20, 7
WARNING = r"^19 of 20 clients have no test samples \(clients 0, 1, 2, 3, 4, \.\.\.\)"


def neural_data(test_parts):
  """20 clients of 6 training samples each (two classes, separable) and test_parts."""
  rng = np.random.default_rng(0)
  y = np.tile([0, 1], 60).astype(np.int32)
  x = (rng.normal(size=(120, 2, 2, 1)) + 2.0 * y[:, None, None, None]).astype(np.float32)
  parts = np.split(np.arange(120), N)
  return fr.client_datasets(x, y, parts, x, y, test_parts, 2)


@pytest.mark.slow  # the fast tier keeps the linear clients' case (below)
def test_neural_clients_without_test_samples_are_left_out():
  """FedAvg's clients are all tested with the global model: with every client tested on
  client 7's test set, each scores client 7's accuracy a, so the mean is a; with only client
  7 tested, the mean must still be a (not a / 20)."""
  algorithm = fr.make_neural_algorithm("fedavg", model=fr.make_model("digits-mlp", 2),
                                       cohort=4, batch_size=6, client_group=None)
  hp = fr.nn_hparams(lr=0.05)
  own = np.arange(TESTED * 6, TESTED * 6 + 6)
  everyone = neural_data([own] * N)
  issue = neural_data([own if i == TESTED else np.arange(0) for i in range(N)])
  with pytest.warns(UserWarning, match=WARNING):
    state = fr.run(algorithm, issue, hp, jax.random.key(0), 3, progress=False).state
  full = fr.evaluate(algorithm, state, everyone, hp)
  metrics = fr.evaluate(algorithm, state, issue, hp)
  assert float(full["test_accuracy"]) > 0.0  # else a and a / 20 would agree
  assert int(metrics["test_clients"]) == 1 and int(full["test_clients"]) == N
  for name in ("test_accuracy", "test_accuracy_weighted", "test_accuracy_p10"):
    np.testing.assert_allclose(metrics[name], full["test_accuracy"], rtol=1e-6, err_msg=name)
  assert float(metrics["test_accuracy_std"]) == 0.0
  new = algorithm.new_clients(state, issue, hp, jax.random.key(1), epochs=1)  # same rule
  assert int(new["test_clients"]) == 1 and float(new["test_accuracy_std"]) == 0.0
  assert float(new["test_accuracy"]) in {float(np.float32(k / 6)) for k in range(7)}  # not k/120


def test_neural_metrics_are_nan_without_any_test_sample():
  algorithm = fr.make_neural_algorithm("fedavg", model=fr.make_model("digits-mlp", 2),
                                       cohort=4, batch_size=6, client_group=None)
  hp = fr.nn_hparams(lr=0.05)
  data = neural_data([np.arange(0)] * N)
  with pytest.warns(UserWarning, match=r"^20 of 20 clients have no test samples .*NaN"):
    state = fr.init_state(algorithm, data, hp, jax.random.key(0))
  metrics = fr.evaluate(algorithm, state, data, hp)
  assert int(metrics["test_clients"]) == 0
  assert all(np.isnan(float(v)) for k, v in metrics.items() if k != "test_clients")


def test_linear_clients_without_test_samples_are_left_out():
  """test_error is client 7's mean squared error on its 4 test samples."""
  problem = fr.make_problem(jax.random.key(0), N, 6, 2, 0.1)
  drawn = fr.make_fixed_data(jax.random.key(1), problem, 8, 4)
  test_counts = np.where(np.arange(N) == TESTED, 4, 0)
  data = fr.client_data(drawn.X, drawn.y, X_test=drawn.X_test, y_test=drawn.y_test,
                        B_star=drawn.B_star, test_counts=test_counts)
  algorithm = fr.FedRep(rep_dim=2, cohort=5)
  hp = fr.LinearHparams(lr=jnp.float32(0.1), head_lr=jnp.float32(0.05))
  with pytest.warns(UserWarning, match=WARNING):
    result = fr.run(algorithm, data, hp, jax.random.key(2), 3, progress=False)
  theta = np.asarray(algorithm.personal_models(result.state, data), np.float64)[TESTED]
  X_test, y_test = np.asarray(data.X_test[TESTED]), np.asarray(data.y_test[TESTED])
  expected = np.mean((X_test @ theta - y_test) ** 2)
  np.testing.assert_allclose(result.metrics["test_error"][-1], expected, rtol=1e-4)
  np.testing.assert_array_equal(result.metrics["test_clients"], 1)


def test_cohort_evaluation_tests_the_last_rounds_cohort_only():
  """eval_clients="cohort": the clients that trained in the last round (as the engine draws
  them) are tested, and they alone, as if the others had no test samples."""
  make = lambda eval_clients: fr.make_neural_algorithm(
      "fedrep", model=fr.make_model("digits-mlp", 2), cohort=4, batch_size=6,
      client_group=None, head_epochs=1, eval_clients=eval_clients)
  hp = fr.nn_hparams(lr=0.05)
  data = neural_data([np.arange(i * 6, i * 6 + 6) for i in range(N)])
  key, rounds = jax.random.key(0), 3
  result = fr.run(make("cohort"), data, hp, key, rounds, eval_every=1, progress=False)
  round_key = jax.random.fold_in(split_run_key(key)[1], rounds - 1)
  last = np.asarray(fr.sample_cohort(jax.random.split(round_key)[0], N, 4))
  np.testing.assert_array_equal(np.flatnonzero(result.state.cohort), np.sort(last))
  np.testing.assert_array_equal(result.eval_metrics["test_clients"], [4] * rounds)
  others_untested = data.replace(test_counts=jnp.where(result.state.cohort, data.test_counts, 0))
  expected = fr.evaluate(make("all"), result.state.replace(cohort=None), others_untested, hp)
  for name, value in expected.items():
    np.testing.assert_allclose(result.eval_metrics[name][-1], value, rtol=1e-6, err_msg=name)
  with pytest.raises(ValueError, match=r"eval_clients='sampled' must be one of"):
    fr.init_state(make("sampled"), data, hp, key)
