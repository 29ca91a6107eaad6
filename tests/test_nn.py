"""The neural engine: vmapped local training, masking, personal state, FedRep's phases,
evaluation and compiles."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.core import tree
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train

HP = fr.nn_hparams(lr=0.1, momentum=0.5, weight_decay=1e-3)
MODEL = fr.make_model("digits-mlp", 10)


def small_data(num_clients=6, seed=0):
  """The first `num_clients` of digits split over 40 clients (~34 samples each)."""
  data = fr.digits.federated(40, "classes", 2, seed=seed)
  return jax.tree.map(lambda a: a[:num_clients], data)


def make(name, cohort=3, **structure):
  structure = {"local_epochs": 1, "head_epochs": 2, "batch_size": 4, "client_group": 2,
               **structure}
  return fr.make_neural_algorithm(name, model=MODEL, cohort=cohort, **structure)


@pytest.mark.parametrize("group", [None, 1, 2, 4])
def test_vmapped_local_training_equals_each_client_alone(group):
  data = small_data()
  algorithm = make("fedper", cohort=6, client_group=group)
  state = algorithm.init(jax.random.key(0), data, HP)
  key = jax.random.key(1)
  clients = jnp.arange(6)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, clients)

  def client(args):
    return algorithm.client_update(state.shared, *args, HP,
                                   algorithm.round_info(state, data.num_clients))

  together = jax.jit(lambda: tree.client_map(
      client, (state.personal, data.x, data.y, data.counts, keys), group))()
  alone = jax.jit(lambda i: client((jax.tree.map(lambda p: p[i], state.personal), data.x[i],
                                    data.y[i], data.counts[i], keys[i])))
  for i in range(6):
    chex.assert_trees_all_close(jax.tree.map(lambda p: p[i], together), alone(i), rtol=1e-5,
                                atol=1e-6)


@pytest.mark.slow
def test_padding_does_not_change_a_clients_training():
  data = small_data()
  algorithm = make("fedrep")
  state = algorithm.init(jax.random.key(0), data, HP)
  i, key = 2, jax.random.key(5)
  personal = jax.tree.map(lambda p: p[i], state.personal)
  info = algorithm.round_info(state, data.num_clients)
  update = jax.jit(lambda x, y: algorithm.client_update(state.shared, personal, x, y,
                                                        data.counts[i], key, HP, info))
  x, y = data.x[i], data.y[i]
  pad = 9
  x_padded = jnp.concatenate([x, jnp.full((pad, *x.shape[1:]), 7.0)])  # junk, not zeros
  y_padded = jnp.concatenate([y, jnp.full((pad,), 3, y.dtype)])
  plain, padded = update(x, y), update(x_padded, y_padded)
  chex.assert_trees_all_close(plain, padded, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_unsampled_and_masked_clients_keep_their_personal_params():
  data = small_data(8)
  algorithm = make("fedrep", cohort=3)
  state = algorithm.init(jax.random.key(0), data, HP)
  # Give every client a distinct head, so "unchanged" is a real check.
  state = state.replace(personal=jax.tree.map(
      lambda p: p + jnp.arange(8.0).reshape(-1, *[1] * (p.ndim - 1)), state.personal))
  clients, mask = jnp.array([5, 1, 6]), jnp.array([True, False, True])
  new, _ = jax.jit(algorithm.masked_round)(state, jax.random.key(1), data, HP, clients, mask)
  for c in range(8):
    old, now = (jax.tree.map(lambda p: p[c], t) for t in (state.personal, new.personal))
    if c in (5, 6):
      assert not any(np.allclose(a, b) for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(now)))
    else:  # unsampled (0, 2, 3, 4, 7) or masked (1)
      chex.assert_trees_all_equal(old, now)


def test_fedrep_head_epochs_leave_the_body_unchanged():
  data = small_data()
  algorithm = make("fedrep", head_epochs=3)
  state = algorithm.init(jax.random.key(0), data, HP)
  assert set(state.shared) == {p for p in state.shared if p.startswith("body/")}
  assert set(state.personal) == {"head/kernel", "head/bias"}
  body_before = jax.tree.map(np.asarray, state.shared)
  head = jax.tree.map(lambda p: p[0], state.personal)
  new_head, _ = jax.jit(lambda: algorithm.train_head(
      state.shared, head, data.x[0], data.y[0], data.counts[0], jax.random.key(2), HP, 3))()
  chex.assert_trees_all_equal(state.shared, body_before)
  assert not np.allclose(new_head["head/kernel"], head["head/kernel"])
  # ... and the head phase trains on features computed once: same as training the head
  # of the whole model with the body frozen.
  def full_loss(h, xb, yb, wb, k):
    return train.cross_entropy(algorithm.logits(params_lib.merge(state.shared, h), xb, k),
                               yb, wb)
  direct, _ = jax.jit(lambda: train.sgd_epochs(full_loss, head, data.x[0], data.y[0],
                                               data.counts[0], jax.random.key(2), HP,
                                               epochs=3, batch_size=4))()
  chex.assert_trees_all_close(new_head, direct, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,shared,personal", [
    ("fedrep", {"body"}, {"head"}), ("fedper", {"body"}, {"head"}),
    ("lg-fedavg", {"body/fc2", "head"}, {"body/fc1"}), ("fedavg", {"body", "head"}, set()),
    ("local", set(), {"body", "head"})])
def test_label_trees(name, shared, personal):
  state = make(name).init(jax.random.key(0), small_data(), HP)
  prefixes = lambda flat: {p.split("/")[0] if p.startswith("head") or name != "lg-fedavg"
                           else p.rsplit("/", 1)[0] for p in flat}
  assert prefixes(state.shared) == shared and prefixes(state.personal) == personal
  for leaf in jax.tree.leaves(state.personal):
    assert leaf.shape[0] == 6


@pytest.mark.slow
def test_server_averages_only_the_shared_params_weighted_by_counts():
  data = small_data()
  algorithm = make("fedavg", cohort=6)
  state = algorithm.init(jax.random.key(0), data, HP)
  key = jax.random.key(3)
  new, metrics = jax.jit(algorithm.masked_round)(state, key, data, HP, jnp.arange(6))
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(6))
  info = algorithm.round_info(state, data.num_clients)
  per_client = [jax.jit(algorithm.client_update)(state.shared, {}, data.x[i], data.y[i],
                                                 data.counts[i], keys[i], HP, info)
                for i in range(6)]
  weights = np.asarray(data.counts, np.float64) / float(np.sum(data.counts))
  expected = {p: sum(w * np.asarray(c[0][p]) for w, c in zip(weights, per_client))
              for p in state.shared}
  chex.assert_trees_all_close(new.shared, expected, rtol=1e-5, atol=1e-6)
  expected_loss = sum(w * float(c[2]) for w, c in zip(weights, per_client))
  np.testing.assert_allclose(metrics["train_loss"], expected_loss, rtol=1e-5)


@pytest.mark.slow
def test_evaluate_is_per_client_accuracy_with_own_params():
  data = small_data()
  algorithm = make("fedrep")
  state = algorithm.init(jax.random.key(0), data, HP)
  state = fr.run(algorithm, data, HP, jax.random.key(1), 4, progress=False).state
  metrics = fr.evaluate(algorithm, state, data, HP)
  accuracies = []
  for i in range(6):
    flat = params_lib.merge(state.shared, jax.tree.map(lambda p: p[i], state.personal))
    logits = algorithm.logits(flat, data.x_test[i, :data.test_counts[i]])
    accuracies.append(np.mean(np.argmax(logits, -1) == data.y_test[i, :data.test_counts[i]]))
  np.testing.assert_allclose(metrics["test_accuracy"], np.mean(accuracies), rtol=1e-6)
  np.testing.assert_allclose(metrics["test_accuracy_std"], np.std(accuracies), rtol=1e-5)


@pytest.mark.slow
def test_run_evaluates_every_eval_every_rounds_and_after_the_last():
  data = small_data()
  result = fr.run(make("fedavg"), data, HP, jax.random.key(0), 7, eval_every=3, progress=False)
  np.testing.assert_array_equal(result.eval_rounds, [3, 6, 7])
  assert result.eval_metrics["test_accuracy"].shape == (3,)
  assert result.metrics["train_loss"].shape == (7,)
  resumed = fr.run(make("fedavg"), data, HP, jax.random.key(0), 7, eval_every=3,
                   state=fr.run(make("fedavg"), data, HP, jax.random.key(0), 4,
                                eval_every=3, progress=False).state, start_round=4,
                   progress=False)
  np.testing.assert_array_equal(resumed.eval_rounds, [6, 7])
  np.testing.assert_allclose(resumed.eval_metrics["test_accuracy"],
                             result.eval_metrics["test_accuracy"][1:], rtol=1e-6)


def test_a_neural_run_compiles_once_across_rounds_chunks_and_seeds(compiles):
  data = small_data()
  algorithm = make("fedrep")
  fr.run(algorithm, data, HP, jax.random.key(0), 6, chunk=2, eval_every=2, progress=False)
  assert compiles.count > 0
  others = [(small_data(seed=1), fr.nn_hparams(lr=0.05, momentum=0.5, weight_decay=1e-4))]
  compiles.reset()
  for seed, (other, hp) in enumerate(others, 1):  # a new seed, new hparams, new data
    fr.run(algorithm, other, hp, jax.random.key(seed), 6, chunk=2, eval_every=2,
           progress=False)
  assert compiles.count == 0


@pytest.mark.slow
def test_seeds_as_one_vmapped_sweep_equal_solo_runs():
  stacked = fr.stack_datasets([small_data(seed=s) for s in (0, 1)])
  datasets = [jax.tree.map(lambda a: a[s], stacked) for s in (0, 1)]  # padded to one shape
  algorithm = make("fedrep")
  keys = jnp.stack([jax.random.key(10), jax.random.key(11)])
  sweep = fr.run(algorithm, stacked, HP, keys, 3, sweep_axes=(0, None, 0),
                 progress=False)
  for s in (0, 1):
    solo = fr.run(algorithm, datasets[s], HP, keys[s], 3, progress=False)
    np.testing.assert_allclose(sweep.metrics["train_loss"][s], solo.metrics["train_loss"],
                               rtol=2e-5)
    np.testing.assert_allclose(sweep.eval_metrics["test_accuracy"][s],
                               solo.eval_metrics["test_accuracy"], rtol=1e-6)


@pytest.mark.slow
def test_fedavg_ft_fine_tunes_only_for_evaluation():
  data = small_data()
  fedavg, fedavg_ft = make("fedavg"), make("fedavg-ft", ft_epochs=3)
  a = fr.run(fedavg, data, HP, jax.random.key(0), 3, progress=False)
  b = fr.run(fedavg_ft, data, HP, jax.random.key(0), 3, progress=False)
  chex.assert_trees_all_equal(a.state.shared, b.state.shared)  # same training
  assert b.eval_metrics["test_accuracy"][-1] > a.eval_metrics["test_accuracy"][-1]


@pytest.mark.slow
def test_local_only_never_communicates():
  data = small_data()
  algorithm = make("local", cohort=6)
  state = algorithm.init(jax.random.key(0), data, HP)
  assert state.shared == {}
  new, _ = jax.jit(algorithm.round)(state, jax.random.key(1), data, HP)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.split(jax.random.key(1))[1],
                                                         jnp.arange(6))
  i = 4
  alone = jax.jit(algorithm.client_update)({}, jax.tree.map(lambda p: p[i], state.personal),
                                           data.x[i], data.y[i], data.counts[i], keys[i], HP,
                                           algorithm.round_info(state, data.num_clients))[1]
  chex.assert_trees_all_close(jax.tree.map(lambda p: p[i], new.personal), alone, rtol=1e-5,
                              atol=1e-6)


@pytest.mark.slow
def test_new_clients_fit_a_head_on_the_learned_body():
  data = small_data(12)
  train_data = jax.tree.map(lambda a: a[:8], data)
  new_data = jax.tree.map(lambda a: a[8:], data)
  algorithm = make("fedrep", cohort=4)
  state = fr.run(algorithm, train_data, HP, jax.random.key(0), 3, progress=False).state
  metrics = jax.jit(algorithm.new_clients, static_argnums=4)(state, new_data, HP,
                                                             jax.random.key(1), 2)
  keys = jax.random.split(jax.random.key(1), 4)
  body = state.shared
  head = {p: jnp.zeros(v.shape[1:]) for p, v in state.personal.items()}
  expected = []
  for i in range(4):
    new_head, _ = jax.jit(algorithm.train_head, static_argnums=7)(
        body, head, new_data.x[i], new_data.y[i], new_data.counts[i], keys[i], HP, 2)
    logits = algorithm.logits(params_lib.merge(body, new_head), new_data.x_test[i])
    count = int(new_data.test_counts[i])
    expected.append(np.mean(np.argmax(np.asarray(logits)[:count], -1)
                            == np.asarray(new_data.y_test[i])[:count]))
  np.testing.assert_allclose(metrics["test_accuracy"], np.mean(expected), rtol=1e-6)
  # (LG-FedAvg's new clients train their own lower layers: test_nn_reference.py's
  # test_new_clients_adapt_as_the_reference_says.)
