"""Neural SRPFL (`timed.EvaluatedTimed` around the neural algorithms) and srpfl-neural:
one compile across stages, masking, LG-SRPFL's local body, the clock, the recipe."""

import dataclasses

import jax
import numpy as np
import pytest

import fedjax_rep as fr
import fedjax_rep.experiments.runner
from fedjax_rep.data import leaf, tfds_data
from fedjax_rep.data.missing import DataMissing
from fedjax_rep.hetero import speeds, timed
from fedjax_rep.recipes.srpfl import neural as srpfl_neural

M = 6
TIMES = np.array([3.0, 1.0, 4.0, 2.0, 5.0, 0.5])  # per local update; fastest: 5, 1, 3, 0, ...
HP = fr.nn_hparams(lr=0.1, momentum=0.5, weight_decay=1e-3)
MODEL = fr.make_model("digits-mlp", 10)  # fc1, fc2, head: LG-FedAvg keeps fc1 personal


def small_data(seed=0):
  """The first M clients of digits split over 40 clients (~34 samples each)."""
  return jax.tree.map(lambda a: a[:M], fr.digits.federated(40, "classes", 2, seed=seed))


def timed_algorithm(name="fedrep", speed_model=None, local_updates=1):
  inner = fr.make_neural_algorithm(name, model=MODEL, cohort=M, local_epochs=1, head_epochs=2,
                                   batch_size=8, client_group=None)
  return timed.EvaluatedTimed(inner, speed_model or speeds.given_speeds(TIMES, M), cohort=M,
                              local_updates=local_updates)


def tree_equal(a, b) -> bool:
  return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)))


@pytest.mark.slow
def test_a_neural_srpfl_run_compiles_once_across_stages_schedules_and_costs(compiles):
  """Chunks of 3 rounds span the stages 1, 2, 4, 6: after the first run, another seed's
  data and key, another C and FedRep's schedule run with no new compilation."""
  algorithm = timed_algorithm(speed_model=speeds.fixed_speeds(M))
  srpfl = timed.srpfl_participants(M, 1, 9, 2)
  run = lambda data, participants, comm_cost, key: fr.run(
      algorithm, data, timed.hparams(HP, participants, comm_cost), jax.random.key(key), 9,
      chunk=3, eval_every=3, progress=False)
  first = run(small_data(0), srpfl, 0.0, 0)
  np.testing.assert_array_equal(first.metrics["participants"], [1, 1, 2, 2, 4, 4, 6, 6, 6])
  compiles.reset()
  costly = run(small_data(0), srpfl, 10.0, 0)
  run(small_data(1), timed.fixed_participants(M, M, 9), 0.0, 1)
  assert compiles.count == 0
  # C changes nothing but the clock: wall_clock + C t (what srpfl-neural relies on)
  np.testing.assert_allclose(costly.metrics["wall_clock"],
                             first.metrics["wall_clock"] + 10.0 * np.arange(1, 10), rtol=1e-6)
  np.testing.assert_array_equal(costly.eval_metrics["test_accuracy"],
                                first.eval_metrics["test_accuracy"])
  assert np.all((first.eval_metrics["test_accuracy"] >= 0)
                & (first.eval_metrics["test_accuracy"] <= 1))


@pytest.mark.slow
def test_masked_clients_keep_their_heads_and_the_clock_waits_for_the_slowest_kept():
  """The fastest 3 (clients 5, 1, 3: 0.5, 1, 2 per update) train; a round lasts
  2 (the slowest kept) x 2 local updates + C = 0.5."""
  algorithm, data = timed_algorithm(local_updates=2), small_data()
  hp = timed.hparams(HP, timed.fixed_participants(M, 3, 2), comm_cost=0.5)
  state = fr.init_state(algorithm, data, hp, jax.random.key(0))
  step = jax.jit(algorithm.round)
  after, metrics = step(state, jax.random.key(1), data, hp)
  kept = np.isin(np.arange(M), [5, 1, 3])
  for path, old in state.inner.personal.items():  # the heads
    new = after.inner.personal[path]
    for i in range(M):
      assert np.array_equal(new[i], old[i]) != kept[i], (path, i)
  assert not tree_equal(after.inner.shared, state.inner.shared)
  assert float(metrics["wall_clock"]) == 4.5 and float(metrics["participants"]) == 3
  assert float(step(after, jax.random.key(2), data, hp)[1]["wall_clock"]) == 9.0


@pytest.mark.slow
def test_lg_srpfl_keeps_each_body_local():
  """LG-FedAvg on the clock with the fastest 2 every round: its first layer (the body) is
  personal, never averaged: the clients never kept still hold the initial body, the two
  kept ones each their own."""
  algorithm, data = timed_algorithm("lg-fedavg"), small_data()
  hp = timed.hparams(HP, timed.fixed_participants(M, 2, 3))
  key = jax.random.key(0)
  initial = fr.init_state(algorithm, data, hp, key).inner
  final = fr.run(algorithm, data, hp, key, 3, progress=False).state.inner
  assert set(final.personal) == {"body/fc1/kernel", "body/fc1/bias"}
  assert not tree_equal(final.shared, initial.shared)  # fc2 and the head are global
  body = lambda state, i: jax.tree.map(lambda p: p[i], state.personal)
  for i in (0, 2, 3, 4):
    assert tree_equal(body(final, i), body(initial, i))
  for i in (1, 5):
    assert not tree_equal(body(final, i), body(initial, i))
  assert not tree_equal(body(final, 1), body(final, 5))


def test_evaluated_timed_needs_an_algorithm_with_evaluate():
  with pytest.raises(TypeError, match="has none: use Timed"):
    timed.EvaluatedTimed(fr.FedRep(rep_dim=2, cohort=M), speeds.fixed_speeds(M), cohort=M)


def test_a_missing_dataset_or_bad_s_stops_before_any_work(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
  monkeypatch.setenv("FEDJAX_REP_LEAF_DIR", str(tmp_path))
  for dataset in ("cifar10", "cifar100", "emnist", "femnist"):
    with pytest.raises(DataMissing, match="run"):
      fr.resolve("srpfl-neural", overrides=[f"dataset={dataset}"])
  with pytest.raises(fr.ConfigError, match="digits has 10 classes"):
    fr.resolve("srpfl-neural", overrides=["classes_per_client=11"])


@pytest.mark.parametrize("dataset,shape,labels", [
    ("cifar10", (32, 32, 3), 10), ("cifar100", (32, 32, 3), 100), ("emnist", (28, 28, 1), 47),
    ("femnist", (28, 28, 1), 10)])
def test_datasets_with_files_give_s_classes_per_client(dataset, shape, labels, monkeypatch):
  """The files' loaders replaced by random arrays: EMNIST keeps its first 10 classes,
  FEMNIST 150 samples per client, every client S classes (the paper's S by default)."""
  rng = np.random.default_rng(0)
  fake = lambda n: (rng.random((n, *shape), np.float32), rng.integers(0, labels, n, np.int32))
  pooled = lambda *args, **kwargs: (*fake(4000), *fake(800))
  monkeypatch.setattr(tfds_data, "_read", lambda *args: (fake(4000), fake(800)))
  monkeypatch.setattr(leaf, "femnist_pooled", pooled)
  config = dataclasses.replace(srpfl_neural.Config(), dataset=dataset, num_clients=10)
  setting = srpfl_neural.setting(config)
  data = srpfl_neural.data(config, [0, 1])
  assert data.x.shape[:2] == (2, 10) and data.x.shape[3:] == shape
  for seed in range(2):
    for i in range(10):
      y = np.asarray(data.y[seed, i, :int(data.counts[seed, i])])
      assert 1 <= len(np.unique(y)) <= setting["classes_per_client"]
      assert y.max() < setting["classes"]
  if dataset == "femnist":
    assert int(data.counts[0].sum()) == 10 * srpfl_neural.FEMNIST_SAMPLES


@pytest.mark.slow
def test_quick_recipe_srpfl_reaches_the_target_before_fedrep_at_no_communication_cost():
  # The settings the assertions read (fixed speeds, C = 0), to keep CI short
  rows, config = fedjax_rep.experiments.runner.run(
      "srpfl-neural", quick=True, progress=False,
      overrides=["speed_models=fixed", "comm_costs=0",
                 "algorithms=srpfl,fedrep,flanp-ft,fedavg-ft"])
  accuracies = np.array([r["test_accuracy"] for r in rows if "test_accuracy" in r])
  assert np.all(np.isfinite(accuracies) & (accuracies >= 0) & (accuracies <= 1))
  summary = {(e["algorithm"], e["speed_model"], e["comm_cost"]): e
             for e in srpfl_neural.summarize(rows, config)}
  for fast, slow in (("srpfl", "fedrep"), ("flanp-ft", "fedavg-ft")):
    assert summary[(fast, "fixed", 0.0)]["reached"] == summary[(slow, "fixed", 0.0)]["reached"]
    assert (summary[(fast, "fixed", 0.0)]["time_to_target"]
            < summary[(slow, "fixed", 0.0)]["time_to_target"])
