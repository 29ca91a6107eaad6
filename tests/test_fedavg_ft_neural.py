"""FedAvg with tau local steps and D-SGD (`nn.fedavg_steps`), the class cosine similarity
of features (`nn.representation`) and the fedavg-ft-neural recipe."""

import csv
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.data.federated import client_datasets
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import models, representation, train
from fedjax_rep.nn.fedavg_steps import FedAvgSteps
from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.fedavg_ft import neural as fedavg_ft_neural
from fedjax_rep.experiments import recipe_registry
from fedjax_rep.experiments import runner
import nn_reference as ref

HP = hparams_lib.hparams(lr=0.1, momentum=0.5, weight_decay=1e-3)
MODEL = models.make_model("digits-mlp", 10)
BATCH = 4
COUNTS = [2, 7, 9, 13, 11]  # m = 13: one partial minibatch per epoch but for the first
RTOL, ATOL = 1e-4, 1e-5


def make_data(seed=0):
  """5 clients of 8x8x1 inputs (class means + noise), COUNTS train rows padded to 13."""
  rng = np.random.default_rng(seed)
  means = rng.normal(size=(10, 8, 8, 1))
  y = rng.integers(0, 10, sum(COUNTS)).astype(np.int32)
  x = (means[y] + rng.normal(size=(len(y), 8, 8, 1))).astype(np.float32)
  parts = np.split(np.arange(len(y)), np.cumsum(COUNTS)[:-1])
  return client_datasets(x, y, parts, x[:5], y[:5], [np.arange(1)] * len(COUNTS), 10)


def make(steps, cohort=3):
  return FedAvgSteps(model=MODEL, cohort=cohort, batch_size=BATCH, client_group=2,
                     local_steps=steps, name="fedavg-steps")


def reference_steps(params, x, y, count, key, hp, steps, batch_size):
  """(params, mean loss) after `steps` SGD steps (PyTorch's SGD, float64, a loop): step s
  takes minibatch s mod E of epoch s div E (E = ceil(count / batch_size)), the epoch's
  order being the package's `epoch_order` with key fold_in(first of split(key), epoch)."""
  params = {p: np.array(v, np.float64) for p, v in params.items()}
  buf = {p: np.zeros_like(v) for p, v in params.items()}
  per_epoch = math.ceil(count / batch_size)
  key_order, _ = jax.random.split(key)
  losses = []
  for s in range(steps):
    epoch, j = divmod(s, per_epoch)
    order = np.asarray(train.epoch_order(jax.random.fold_in(key_order, epoch),
                                         jnp.int32(count), x.shape[0]))
    rows = order[j * batch_size:min((j + 1) * batch_size, count)]
    loss, grads = ref.loss_and_grads(params, x[rows], y[rows])
    losses.append(loss)
    for p in params:
      buf[p] = float(hp.momentum) * buf[p] + grads[p] + float(hp.weight_decay) * params[p]
      params[p] = params[p] - float(hp.lr) * buf[p]
  return params, float(np.mean(losses))


def reference_round(shared, key, data, hp, clients, steps):
  """The server's model after clients `clients` train `reference_steps` from `shared` with
  keys fold_in(key, i), averaged weighted by their sample counts."""
  trained, counts = [], []
  for i in np.asarray(clients):
    count = int(data.counts[i])
    trained.append(reference_steps(shared, np.asarray(data.x[i], np.float64),
                                   np.asarray(data.y[i]), count, jax.random.fold_in(key, i),
                                   hp, steps, BATCH)[0])
    counts.append(count)
  return {p: sum(c * t[p] for c, t in zip(counts, trained)) / sum(counts) for p in shared}


@pytest.mark.parametrize("i", [0, 3])  # count 2 < batch (one step an epoch); count 13
def test_client_steps_match_reference(i):
  data = make_data()
  algorithm = make(11)  # several epochs, crossing epoch boundaries
  state = algorithm.init(jax.random.key(0), data, HP)
  shared, info = state.shared, algorithm.round_info(state, data.num_clients)
  key = jax.random.key(3)
  x, y, count = data.x[i], data.y[i], data.counts[i]
  junk = jnp.full((5, *x.shape[1:]), 7.0)  # padding past the real rows must not matter
  padded = (jnp.concatenate([x, junk]), jnp.concatenate([y, jnp.full((5,), 3, y.dtype)]))
  trained, personal, loss = jax.jit(algorithm.client_update)(shared, {}, *padded, count, key,
                                                              HP, info)
  expected, expected_loss = reference_steps(shared, np.asarray(x, np.float64), np.asarray(y),
                                            int(count), key, HP, 11, BATCH)
  assert personal == {}
  chex.assert_trees_all_close(trained, expected, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(loss, expected_loss, rtol=RTOL)


def test_rounds_match_reference():
  """Three tau = 3 rounds: sampled cohorts, count-weighted averages."""
  data = make_data()
  algorithm = make(3)
  state = algorithm.init(jax.random.key(0), data, HP)
  shared = {p: np.asarray(v, np.float64) for p, v in state.shared.items()}
  round_fn = jax.jit(algorithm.round)
  for t in range(3):
    key = jax.random.fold_in(jax.random.key(1), t)
    state, _ = round_fn(state, key, data, HP)
    key_cohort, key_clients = jax.random.split(key)
    clients = cohort_lib.sample_cohort(key_cohort, data.num_clients, algorithm.cohort)
    shared = reference_round(shared, key_clients, data, HP, clients, 3)
  chex.assert_trees_all_close(state.shared, shared, rtol=RTOL, atol=ATOL)


def test_d_sgd_round_is_one_sgd_step_on_the_mean_gradient():
  """tau = 1 (D-SGD): averaging after every step is mini-batch SGD, theta - lr (sum_i n_i
  (g_i + wd theta) / sum_i n_i), g_i the gradient of client i's first minibatch."""
  data = make_data()
  algorithm = make(1, cohort=5)
  state = algorithm.init(jax.random.key(0), data, HP)
  clients, key = jnp.array([4, 0, 3, 1, 2]), jax.random.key(7)
  new, metrics = jax.jit(algorithm.masked_round)(state, key, data, HP, clients)
  theta = {p: np.asarray(v, np.float64) for p, v in state.shared.items()}
  step = {p: np.zeros_like(v) for p, v in theta.items()}
  losses = []
  for i in np.asarray(clients):
    count = int(data.counts[i])
    key_order, _ = jax.random.split(jax.random.fold_in(key, i))
    rows = np.asarray(train.epoch_order(jax.random.fold_in(key_order, 0), jnp.int32(count),
                                        data.samples))[:min(BATCH, count)]
    loss, grads = ref.loss_and_grads(theta, np.asarray(data.x[i], np.float64)[rows],
                                     np.asarray(data.y[i])[rows])
    losses.append(count * loss)
    for p in step:
      step[p] += count * (grads[p] + float(HP.weight_decay) * theta[p]) / sum(COUNTS)
  chex.assert_trees_all_close(new.shared, {p: theta[p] - float(HP.lr) * step[p] for p in theta},
                              rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(metrics["train_loss"], sum(losses) / sum(COUNTS), rtol=RTOL)


@pytest.mark.slow
def test_registered_d_sgd_is_fedavg_steps_with_one_step():
  """Once registered: 'd-sgd' is 'fedavg-steps' with tau = 1, whatever tau it is given."""
  if "d-sgd" not in fr.ALGORITHMS.get("neural", {}):
    pytest.skip("fedavg-steps and d-sgd are not registered yet")
  def made(name, steps):
    return fr.make_neural_algorithm(name, model=MODEL, cohort=3, batch_size=BATCH,
                                    client_group=2, local_steps=steps)

  d_sgd, fedavg = made("d-sgd", 5), made("fedavg-steps", 1)
  assert d_sgd.local_steps == 1 and made("fedavg-steps", 5).local_steps == 5
  data = make_data()
  a, b = (fr.run(alg, data, HP, jax.random.key(0), 3, progress=False).state.shared
          for alg in (d_sgd, fedavg))
  chex.assert_trees_all_equal(a, b)


def test_local_steps_must_be_positive():
  with pytest.raises(ValueError, match="local_steps must be an integer >= 1"):
    make(0)


def reference_similarity(features, labels, num_classes):
  """[C, C] by a loop over the pairs of distinct rows with labels in [0, C)."""
  sums, pairs = np.zeros((num_classes, num_classes)), np.zeros((num_classes, num_classes))
  for i, (h, a) in enumerate(zip(features, labels)):
    for j, (g, b) in enumerate(zip(features, labels)):
      if i != j and 0 <= a < num_classes and 0 <= b < num_classes:
        norms = np.linalg.norm(h) * np.linalg.norm(g)
        sums[a, b] += h @ g / norms if norms > 0 else 0.0
        pairs[a, b] += 1
  return np.where(pairs > 0, sums / np.maximum(pairs, 1), np.nan)


def test_class_cosine_similarity_matches_reference():
  rng = np.random.default_rng(0)
  features = rng.normal(size=(30, 6)).astype(np.float32)
  features[[2, 11]] = 0.0  # dead features: cosine 0 with everything
  labels = np.array([0, 1, 2, 3] * 7 + [-1, 4])  # class 4 has one example, class 5 none
  matrix = jax.jit(representation.class_cosine_similarity, static_argnums=2)(
      features, labels, 6)
  expected = reference_similarity(features.astype(np.float64), labels, 6)
  np.testing.assert_allclose(matrix, expected, rtol=1e-5, atol=1e-6)
  assert np.isnan(matrix[4, 4]) and np.isnan(matrix[5]).all() and np.isfinite(matrix[4, :4]).all()
  gap = representation.similarity_gap(matrix[:4, :4])
  off = ~np.eye(4, dtype=bool)
  np.testing.assert_allclose(gap, np.diag(expected)[:4].mean() - expected[:4, :4][off].mean(),
                             rtol=1e-5)
  np.testing.assert_allclose(representation.similarity_gap(jnp.eye(3)), 1.0)


def test_config_checks_the_split():
  with pytest.raises(cfg.ConfigError, match="leaves 1 class"):
    recipe_registry.resolve("fedavg-ft-neural", overrides=["unseen_classes=9"])
  with pytest.raises(cfg.ConfigError, match="finetune_samples=500"):
    recipe_registry.resolve("fedavg-ft-neural", overrides=["finetune_samples=1,500"])


@pytest.mark.slow
def test_recipe_quick(tmp_path):
  out = runner.run_to_dir("fedavg-ft-neural", quick=True, seeds=2, out=str(tmp_path),
                           progress=False)
  config = recipe_registry.resolve("fedavg-ft-neural", quick=True)
  with open(f"{out}/summary.csv") as f:
    summary = list(csv.DictReader(f))
  assert [(r["algorithm"], int(r["finetune_samples"])) for r in summary] == [
      (name, k) for name in fedavg_ft_neural.COMPARED for k in config.finetune_samples]
  for r in summary:
    for column in ("new_client_accuracy", "final_test_accuracy", "similarity_gap_seen",
                   "similarity_gap_unseen"):
      assert np.isfinite(float(r[column])), (r, column)
    assert 0.0 <= float(r["new_client_accuracy"]) <= 1.0
    assert float(r["final_test_accuracy"]) > 0.5  # both algorithms learn the seen classes
  with open(f"{out}/metrics.csv") as f:
    rows = list(csv.DictReader(f))
  training = [r for r in rows if r["train_loss"]]
  assert len(training) == 2 * config.rounds * (1 + config.local_steps)
  chex.assert_tree_all_finite([float(r["train_loss"]) for r in training])
  entries = [r for r in rows if r["cosine_similarity"]]
  assert len(entries) == 2 * 2 * 10 * 10
  assert all(-1.0 <= float(r["cosine_similarity"]) <= 1.0 for r in entries)
  assert (tmp_path / "fedavg-ft-neural.png").stat().st_size > 0


@pytest.mark.slow
def test_diverged_runs_analysis_is_nan_and_left_out_of_the_summary(tmp_path, capsys):
  """With lr = 1e6 every run diverges: the analysis of its final model (kept from before it
  diverged) is NaN in metrics.csv (similarities, gaps, new clients' accuracy), and
  summary.csv counts the runs in `diverged` and averages none (NaN)."""
  out = runner.run_to_dir("fedavg-ft-neural", quick=True, seeds=2, out=str(tmp_path),
                           overrides=["lr=1e6"], progress=False)
  assert len(capsys.readouterr().err.splitlines()) == 2 * len(fedavg_ft_neural.COMPARED)
  with open(f"{out}/metrics.csv") as f:
    rows = list(csv.DictReader(f))
  analysis = [r for r in rows if r["cosine_similarity"] or r["new_client_accuracy"]
              or r["similarity_gap_seen"]]
  assert analysis and all(math.isnan(float(v)) for r in analysis for k, v in r.items()
                          if v and k in ("cosine_similarity", "similarity_gap_seen",
                                         "similarity_gap_unseen", "new_client_accuracy",
                                         "new_client_accuracy_std"))
  with open(f"{out}/summary.csv") as f:
    summary = list(csv.DictReader(f))
  assert all(r["diverged"] == "2" and r["seeds"] == "0"
             and math.isnan(float(r["new_client_accuracy"]))
             and math.isnan(float(r["final_test_accuracy"])) for r in summary)


def test_the_summary_leaves_out_diverged_runs():
  """Seed 1 diverged: the summary averages seed 0's numbers alone and counts seed 1."""
  config = recipe_registry.resolve("fedavg-ft-neural", quick=True, overrides=["finetune_samples=1"])
  rows = []
  for name in fedavg_ft_neural.COMPARED:
    for seed, value, diverged in ((0, 0.5, 0), (1, np.nan, 3)):
      base = {"algorithm": name, "seed": seed, "round": 5}
      rows += [{**base, "diverged_round": diverged, "test_accuracy": value},
               {**base, "similarity_gap_seen": value, "similarity_gap_unseen": value},
               {**base, "finetune_samples": 1, "new_client_accuracy": value}]
  summary = fedavg_ft_neural.summarize(rows, config)
  assert [(r["algorithm"], r["seeds"], r["diverged"]) for r in summary] == [
      (name, 1, 1) for name in fedavg_ft_neural.COMPARED]
  for r in summary:
    assert r["new_client_accuracy"] == r["final_test_accuracy"] == 0.5
    assert r["similarity_gap_seen"] == r["similarity_gap_unseen"] == 0.5
    assert r["new_client_accuracy_std_over_seeds"] == 0
