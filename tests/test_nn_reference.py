"""The neural algorithms' rounds and evaluation against the numpy reference (nn_reference):
a tiny MLP, hand-made client data with partial minibatches, float32 tolerance."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_rep.data.federated import client_datasets
from fedjax_rep.data.flat import flat_clients
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import models
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.new_clients import NewClients, WithNewClients
from fedjax_rep.nn import algorithms as nn_algorithms
import nn_reference as ref

HP = hparams_lib.hparams(lr=0.1, momentum=0.5, weight_decay=1e-3)
MODEL = models.make_model("digits-mlp", 10)
STRUCTURE = dict(local_epochs=1, head_epochs=2, batch_size=4, client_group=2)
COUNTS = [7, 8, 10, 11, 13, 14]  # m = 14: 4 steps of 4, some partial, some empty
TEST_COUNTS = [3, 4, 5, 3, 4, 5]
# Heavy-tailed sizes: clients of 3 samples next to one of 300 (padded to 300).
WIDE_COUNTS = [3, 300, 5, 60, 3, 150]
# (clients, mask) of the two rounds: cohorts of 4 (two groups of 2), the second with one
# client masked. The same shapes in both rounds, so each algorithm compiles its round once.
ROUNDS = [(np.array([4, 1, 3, 0]), np.array([True, True, True, True])),
          (np.array([0, 4, 2, 5]), np.array([True, False, True, True]))]
RTOL, ATOL = 1e-4, 1e-5


def make_data(seed=0, counts=COUNTS, layout=client_datasets):
  """6 clients of 8x8x1 inputs (class means + noise), 10 classes, `counts` train rows
  padded to the largest (COUNTS: 14) and TEST_COUNTS test rows padded to 5 (layout
  flat_clients: in one flat store)."""
  rng = np.random.default_rng(seed)
  means = rng.normal(size=(10, 8, 8, 1))

  def sample(k):
    y = rng.integers(0, 10, k)
    return (means[y] + rng.normal(size=(k, 8, 8, 1))).astype(np.float32), y.astype(np.int32)

  x, y = sample(sum(counts))
  x_test, y_test = sample(sum(TEST_COUNTS))
  parts = np.split(np.arange(len(y)), np.cumsum(counts)[:-1])
  test_parts = np.split(np.arange(len(y_test)), np.cumsum(TEST_COUNTS)[:-1])
  return layout(x, y, parts, x_test, y_test, test_parts, 10)


def make(name, **structure):
  return nn_algorithms.make_algorithm(name, model=MODEL, cohort=3, **{**STRUCTURE, **structure})


def initial_state(algorithm, data):
  """The package's initial state with every client's personal params perturbed apart (so
  that whose params a client trains from matters)."""
  state = algorithm.init(jax.random.key(0), data, HP)
  personal = {p: v + 0.05 * jax.random.normal(jax.random.fold_in(jax.random.key(1), j),
                                               v.shape)
              for j, (p, v) in enumerate(sorted(state.personal.items()))}
  return state.replace(personal=personal)


def server_and_shared(state) -> dict:
  """A package state's shared params and, under 'control/<param>', SCAFFOLD's server
  control variates (its server state), as the reference keeps them."""
  controls = state.server.get("control", {})
  return {**state.shared, **{ref.CONTROL + p: v for p, v in controls.items()}}


def to_reference(state, num_clients):
  """(shared {name: float64}, personal [client i's {name: float64}]) of a package state."""
  shared = {p: np.asarray(v, np.float64) for p, v in server_and_shared(state).items()}
  personal = [{p: np.asarray(v[i], np.float64) for p, v in state.personal.items()}
              for i in range(num_clients)]
  return shared, personal


def from_reference(state, shared, personal):
  """The package state `state` with the reference's params (as float32) in it."""
  server = {"control": {p.removeprefix(ref.CONTROL): jnp.asarray(v, jnp.float32)
                        for p, v in shared.items() if p.startswith(ref.CONTROL)}}
  return state.replace(
      server=server if state.server else state.server,
      shared={p: jnp.asarray(v, jnp.float32) for p, v in shared.items()
              if not p.startswith(ref.CONTROL)},
      personal={p: jnp.asarray(np.stack([q[p] for q in personal]), jnp.float32)
                for p in state.personal})


def assert_states_close(state, shared, personal):
  """`state`'s params equal the reference's `shared` (a dict) and `personal` (a dict per
  client, all with the same keys) to RTOL, ATOL."""
  stacked = jax.tree.map(lambda *q: np.stack(q), *personal)
  chex.assert_trees_all_close((server_and_shared(state), state.personal), (shared, stacked),
                              rtol=RTOL,
                              atol=ATOL)


_JITTED = {}


def jitted(algorithm, method):
  """jax.jit of algorithm.<method>, one per (algorithm, method) (compiled once a shape)."""
  if (algorithm, method) not in _JITTED:
    _JITTED[algorithm, method] = jax.jit(getattr(algorithm, method))
  return _JITTED[algorithm, method]


def run_package(algorithm, state, data, key, rounds=ROUNDS, hparams=HP):
  """The package's state and train losses after `rounds`, each under jit (with `hparams`)."""
  step = jitted(algorithm, "masked_round")
  losses = []
  for t, (clients, mask) in enumerate(rounds):
    state, metrics = step(state, jax.random.fold_in(key, t), data, hparams, jnp.asarray(clients),
                          None if mask is None else jnp.asarray(mask))
    losses.append(float(metrics["train_loss"]))
  return state, losses


def run_reference(name, shared, personal, data, key, rounds=ROUNDS):
  data, losses = ref.per_client(data), []
  for t, (clients, mask) in enumerate(rounds):
    shared, personal, loss = ref.masked_round(
        name, shared, personal, jax.random.fold_in(key, t), data, HP, clients, mask,
        local_epochs=STRUCTURE["local_epochs"], head_epochs=STRUCTURE["head_epochs"],
        batch_size=STRUCTURE["batch_size"])
    losses.append(loss)
  return shared, personal, losses


def test_reference_gradients_match_finite_differences():
  rng = np.random.default_rng(0)
  params = {"body/fc1/kernel": rng.normal(size=(6, 5)), "body/fc1/bias": rng.normal(size=5),
            "body/fc2/kernel": rng.normal(size=(5, 4)), "body/fc2/bias": rng.normal(size=4),
            "head/kernel": rng.normal(size=(4, 3)), "head/bias": rng.normal(size=3)}
  x, y = rng.normal(size=(7, 6)), rng.integers(0, 3, 7)
  _, grads = ref.loss_and_grads(params, x, y)
  eps = 1e-6
  numeric = {p: np.zeros_like(v) for p, v in params.items()}
  for p, v in params.items():
    for j in np.ndindex(v.shape):
      plus = {**params, p: v.copy()}
      plus[p][j] += eps
      minus = {**params, p: v.copy()}
      minus[p][j] -= eps
      numeric[p][j] = (ref.loss_and_grads(plus, x, y)[0]
                       - ref.loss_and_grads(minus, x, y)[0]) / (2 * eps)
  chex.assert_trees_all_close(grads, numeric, rtol=1e-5, atol=1e-8)


def test_reference_forward_matches_the_model():
  data = make_data()
  algorithm = make("fedavg")
  state = algorithm.init(jax.random.key(0), data, HP)
  shared, _ = to_reference(state, data.num_clients)
  logits, _ = ref.forward(shared, np.asarray(data.x[0], np.float64))
  np.testing.assert_allclose(algorithm.logits(state.shared, data.x[0]), logits, rtol=RTOL,
                             atol=ATOL)


@pytest.mark.parametrize("name, counts, layout", [
    *(pytest.param(name, COUNTS, client_datasets, id=name) for name in ref.ALGORITHMS),
    *(pytest.param(name, WIDE_COUNTS, layout, id=f"{name}-wide-{layout.__name__}")
      for name in ("fedrep", "fedavg") for layout in (client_datasets, flat_clients))])
def test_rounds_match_reference(name, counts, layout):
  data = make_data(counts=counts, layout=layout)
  algorithm = make(name)
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  key = jax.random.key(3)
  state, losses = run_package(algorithm, state, data, key)
  shared, personal, ref_losses = run_reference(name, shared, personal, data, key)
  assert_states_close(state, shared, personal)
  np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)


def test_a_fully_masked_round_changes_nothing():
  data = make_data()
  algorithm = make("fedper")
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  rounds = [(np.array([1, 2, 3, 4]), np.array([False, False, False, False]))]
  new_state, losses = run_package(algorithm, state, data, jax.random.key(3), rounds)
  new_shared, new_personal, ref_losses = run_reference("fedper", shared, personal, data,
                                                       jax.random.key(3), rounds)
  assert_states_close(new_state, new_shared, new_personal)
  assert_states_close(new_state, shared, personal)
  assert losses == ref_losses == [0.0]


def test_unmasked_rounds_match_reference():
  data = make_data()
  algorithm = make("fedrep")
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  rounds = [(clients, None) for clients, _ in ROUNDS]
  key = jax.random.key(4)
  state, losses = run_package(algorithm, state, data, key, rounds)
  shared, personal, ref_losses = run_reference("fedrep", shared, personal, data, key, rounds)
  assert_states_close(state, shared, personal)
  np.testing.assert_allclose(losses, ref_losses, rtol=RTOL, atol=ATOL)


EVAL_METRICS = ("test_accuracy", "test_accuracy_weighted", "test_accuracy_std",
                "test_accuracy_p10", "test_clients")


@pytest.mark.parametrize("name,ft_epochs,test_counts,counts,layout", [
    ("fedrep", 0, None, COUNTS, client_datasets), ("fedavg-ft", 2, None, COUNTS, client_datasets),
    ("fedrep", 0, [3, 0, 5, 0, 1, 5], COUNTS, client_datasets),
    ("fedavg-ft", 2, [0, 0, 0, 0, 4, 0], COUNTS, client_datasets),
    ("fedrep", 0, None, WIDE_COUNTS, flat_clients),
    ("fedavg-ft", 2, None, WIDE_COUNTS, flat_clients)])
def test_evaluation_matches_reference(name, ft_epochs, test_counts, counts, layout):
  """Evaluation of a state trained by the reference's rounds (the package's rounds agree
  with them, tested above), so that the package compiles evaluate only; with test_counts,
  some clients have no test samples (left out of every metric); heavy-tailed clients in a
  flat store."""
  data = make_data(counts=counts, layout=layout)
  if test_counts is not None:
    data = data.replace(test_counts=jnp.asarray(test_counts, jnp.int32))
  algorithm = make(name, ft_epochs=2)
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  shared, personal, _ = run_reference("fedavg" if name == "fedavg-ft" else name, shared,
                                      personal, data, jax.random.key(3))
  state = from_reference(state, shared, personal)
  metrics = jitted(algorithm, "evaluate")(state, data, HP)
  shared, personal = to_reference(state, data.num_clients)
  expected = ref.evaluate(shared, personal, ref.per_client(data), HP, ft_epochs=ft_epochs,
                          eval_key=state.eval_key, batch_size=STRUCTURE["batch_size"])
  assert set(metrics) == set(EVAL_METRICS)
  for metric in EVAL_METRICS:
    np.testing.assert_allclose(float(metrics[metric]), expected[metric], atol=1e-6,
                               err_msg=metric)


def test_fine_tuned_heads_match_reference():
  """FedAvg-FT's fine-tuned params of every client (what evaluate tests it with)."""
  data = make_data()
  algorithm = make("fedavg-ft", ft_epochs=2)
  state = initial_state(algorithm, data)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
      jax.random.wrap_key_data(state.eval_key), jnp.arange(data.num_clients))
  tuned = jax.jit(jax.vmap(lambda x, y, count, key: algorithm.eval_params(
      state.shared, {}, x, y, count, key, HP)))(data.x, data.y, data.counts, keys)
  shared, personal = to_reference(state, data.num_clients)
  for i in range(data.num_clients):
    expected = ref.eval_params(shared, personal[i], data, i, HP, ft_epochs=2,
                               eval_key=state.eval_key, batch_size=STRUCTURE["batch_size"])
    chex.assert_trees_all_close(jax.tree.map(lambda v: v[i], tuned), expected, rtol=RTOL,
                                atol=ATOL)


@pytest.mark.parametrize("name", ["fedrep", "fedavg-ft", "lg-fedavg", "local"])
def test_new_clients_adapt_as_the_reference_says(name):
  """Clients that never trained, tested at an evaluation of `NewClients`: FedRep and
  FedAvg-FT fit a head from zero on the server's frozen body; LG-FedAvg and local only train
  their personal leaves from a fresh draw of the initialisation, the shared ones frozen. The
  training clients' metrics are the algorithm's own evaluation."""
  data, new = make_data(), make_data(seed=1)
  algorithm = make(name, ft_epochs=2) if name == "fedavg-ft" else make(name)
  state = initial_state(algorithm, data)
  metrics = jax.jit(NewClients(algorithm, epochs=2).evaluate)(
      state, WithNewClients(train=data, new=new), HP)
  key = jax.random.fold_in(jax.random.wrap_key_data(state.eval_key), 1)
  fresh = [params_lib.flatten(MODEL.init(jax.random.split(client_key)[0],
                                         new.x[i][:1])["params"])
           for i, client_key in enumerate(jax.random.split(key, new.num_clients))]
  shared, _ = to_reference(state, data.num_clients)
  expected = ref.new_clients(name, shared, ref.per_client(new), key, HP, 2,
                             STRUCTURE["batch_size"], fresh)
  for metric, value in expected.items():
    np.testing.assert_allclose(float(metrics[metric]), value, atol=1e-6, err_msg=metric)
  own = jitted(algorithm, "evaluate")(state, data, HP)
  assert {k: float(v) for k, v in own.items()} == {k: float(metrics[k]) for k in own}
