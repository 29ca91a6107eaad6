"""The fedrep-fig6 recipe (FedRep Fig. 6): its data (training classes apart from the new
clients'), its fine-tuning curve (each point the algorithm's `new_clients` at that epoch
count, and the first epochs of the longest fine-tuning), and a --quick run's files."""

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_rep import cli
from fedjax_rep.core import tree
from fedjax_rep.data import digits
from fedjax_rep.nn import models
from fedjax_rep.nn import params as params_lib
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import recipe_registry
from fedjax_rep.recipes.fedrep import fig6
from fedjax_rep.recipes.kit import neural


def small_config(*overrides):
  return recipe_registry.resolve("fedrep-fig6", quick=True, overrides=list(overrides))


def test_training_and_new_clients_hold_different_classes():
  config = small_config("finetune_clients=3", "finetune_samples=40", "finetune_test=30")
  clients, new = fig6.seed_data(config, 1)
  seen = digits.NUM_CLASSES - config.unseen_classes
  train_labels = [np.asarray(clients.y[i, :c]) for i, c in enumerate(clients.counts)]
  assert clients.num_clients == 10 and all(np.all(y < seen) for y in train_labels)
  assert all(len(np.unique(y)) <= 2 for y in train_labels)  # S = 2 classes each
  assert np.all(np.asarray(new.counts) == 40) and np.all(np.asarray(new.test_counts) == 30)
  assert np.all(np.asarray(new.y) >= seen) and np.all(np.asarray(new.y_test) >= seen)
  assert not np.array_equal(np.asarray(new.x[0]), np.asarray(new.x[1]))
  again = fig6.seed_data(config, 1)[1]
  assert np.array_equal(np.asarray(again.x), np.asarray(new.x))  # the seed decides


def test_auto_setting_and_bad_values():
  config = small_config()
  assert fig6.setting(config) == (10, 2)
  assert fig6.setting(recipe_registry.resolve("fedrep-fig6")) == (30, 2)
  assert fig6.setting(recipe_registry.resolve(
      "fedrep-fig6", overrides=["dataset=femnist", "source=mock"])) == (150, 3)
  assert recipe_registry.resolve("fedrep-fig6").algorithms == fig6.DEFAULT_ALGORITHMS
  with pytest.raises(cfg.ConfigError, match="finetune_samples=5000 is more than"):
    small_config("finetune_samples=5000")
  with pytest.raises(cfg.ConfigError, match="leaves no class to train on"):
    small_config("unseen_classes=10")


@pytest.mark.slow  # the fast tier keeps test_new_clients.py's checks of the same new_clients
def test_each_point_is_new_clients_at_that_epoch_count():
  """`fine_tuned` at epochs (1, 3) gives, per run, what FedRep's `new_clients` gives at 1
  and 3 epochs (a head on the frozen body); and 3 epochs of head SGD stopped after 1
  (`active`) are the 1-epoch head: the curve's points are the first epochs of one
  fine-tuning."""
  config = small_config("finetune_clients=2", "finetune_samples=30", "finetune_test=20")
  data = [fig6.seed_data(config, s) for s in (0, 1)]
  new = tree.stack([n for _, n in data])
  model = models.make_model("digits-mlp", 10)
  hparams = neural.hparams(config)
  keys = jax.random.split(jax.random.key(3), 2)
  algorithm = neural.algorithm("fedrep", config, model, 10)
  states = [algorithm.init(jax.random.key(s), data[s][0], hparams) for s in (0, 1)]
  state = jax.tree.map(lambda *v: jnp.stack(v), *states)
  curve = fig6.fine_tuned(algorithm, state, new, hparams, keys, epochs=(1, 3))
  assert curve["test_accuracy"].shape == (2, 2)
  direct = jax.jit(algorithm.new_clients, static_argnums=4)
  for s in (0, 1):
    for j, epochs in enumerate((1, 3)):
      one = jax.tree.map(lambda v, s=s: v[s], new)
      expected = direct(states[s], one, hparams, keys[s], epochs)
      np.testing.assert_allclose(curve["test_accuracy"][s, j], expected["test_accuracy"],
                                 atol=1e-6)
      np.testing.assert_allclose(curve["test_accuracy_std"][s, j],
                                 expected["test_accuracy_std"], atol=1e-6)
  flat = params_lib.merge(states[0].shared, {p: v[0] for p, v in states[0].personal.items()})
  body, head = params_lib.split(flat, params_lib.head_personal(flat))
  head = jax.tree.map(jnp.zeros_like, head)
  x, y, count = new.x[0, 0], new.y[0, 0], new.counts[0, 0]
  short = algorithm.train_head(body, head, x, y, count, keys[0], hparams, 1)[0]
  stopped = algorithm.train_head(body, head, x, y, count, keys[0], hparams, 3,
                                 active=jnp.int32(1))[0]
  longer = algorithm.train_head(body, head, x, y, count, keys[0], hparams, 3)[0]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), short,
               stopped)
  assert not all(np.allclose(a, b) for a, b in zip(jax.tree.leaves(short),
                                                   jax.tree.leaves(longer)))


@pytest.mark.slow  # the seven algorithms of the figure, 3 seeds: about 40 CPU-s
def test_quick_run_writes_its_files(tmp_path):
  assert cli.main(["run", "fedrep-fig6", "--quick", "--no-progress", "--out",
                   str(tmp_path)]) == 0
  assert (tmp_path / "fedrep-fig6.png").stat().st_size > 0
  with open(tmp_path / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  config = small_config()
  tuned = [r for r in rows if r["finetune_epochs"]]
  assert len(tuned) == len(fig6.DEFAULT_ALGORITHMS) * 3 * len(config.finetune_epochs)
  assert all(0 <= float(r["new_client_accuracy"]) <= 1 for r in tuned)
  assert {r["round"] for r in tuned} == {str(config.rounds)}
  assert {r["algorithm"] for r in rows if r["train_loss"]} == set(fig6.DEFAULT_ALGORITHMS)
  with open(tmp_path / "fig6.csv") as f:
    summary = list(csv.DictReader(f))
  assert [(r["algorithm"], int(r["finetune_epochs"])) for r in summary] == [
      (name, e) for name in fig6.DEFAULT_ALGORITHMS for e in config.finetune_epochs]
  assert all(r["seeds"] == "3" for r in summary)
  for r in summary:  # the summary is the mean over the seeds' rows
    values = [float(t["new_client_accuracy"]) for t in tuned if t["algorithm"] == r["algorithm"]
              and t["finetune_epochs"] == r["finetune_epochs"]]
    assert float(r["new_client_accuracy"]) == pytest.approx(np.mean(values), rel=1e-6)


@pytest.mark.slow  # FEMNIST's path on random LEAF-format files: about 15 s on 2 cores
def test_femnist_path_on_mock_files(tmp_path):
  assert cli.main(["run", "fedrep-fig6", "--quick", "--no-progress", "--seeds", "1",
                   "--set", "dataset=femnist", "--set", "source=mock",
                   "--set", "mock_examples=60", "--set", "algorithms=fedrep,fedavg",
                   "--set", "rounds=2", "--set", "finetune_epochs=1,2",
                   "--out", str(tmp_path)]) == 0
  with open(tmp_path / "fig6.csv") as f:
    summary = list(csv.DictReader(f))
  assert [(r["algorithm"], r["finetune_epochs"]) for r in summary] == [
      ("fedrep", "1"), ("fedrep", "2"), ("fedavg", "1"), ("fedavg", "2")]
