"""fedavg-ft-fig2 and fedavg-ft-fig5: models trained on one dataset, fine-tuned on new clients
from another (`recipes.fedavg_ft.transfer`), the CKA of each layer (fig2) and the new
clients' accuracy (fig5)."""

import csv
import math

import jax
import numpy as np
import pytest

from fedjax_rep import cli
from fedjax_rep.data import digits
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import recipe_registry
from fedjax_rep.nn import algorithms as nn_algorithms
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import models
from fedjax_rep.nn import params as params_lib
from fedjax_rep.recipes.fedavg_ft import compared, fig2, fig5, transfer


def test_the_transformed_dataset_mirrors_inverts_and_relabels():
  """transformed: x -> 1 - x mirrored left-right, y -> (y + C/2) mod C; twice: the same."""
  arrays = digits.load(0)
  x, y, x_test, y_test = transfer.transformed(arrays, 10)
  np.testing.assert_array_equal(x[:, :, 0], 1.0 - arrays[0][:, :, 7])
  np.testing.assert_array_equal(y, (arrays[1] + 5) % 10)
  assert x.dtype == arrays[0].dtype and y.dtype == arrays[1].dtype
  assert x_test.shape == arrays[2].shape and np.all(y_test == (arrays[3] + 5) % 10)
  for again, original in zip(transfer.transformed((x, y, x_test, y_test), 10), arrays):
    np.testing.assert_array_equal(again, original)


def test_seed_data_new_clients_extend_their_draws():
  """New clients [K, J]: client j's k samples are the first k of its own draw of the new
  (transformed) training split, padded to the largest k; each tested on up to
  new_test_samples of the new test split; the probe is a draw of that split."""
  config = recipe_registry.resolve("fedavg-ft-fig5", quick=True, overrides=[
      "finetune_samples=3,7", "transfer_clients=4", "new_test_samples=50"])
  arrays = digits.load(config.seed)
  clients, new, probe = transfer.seed_data(config, arrays, config.seed, probe_samples=30)
  assert clients.num_clients == config.num_clients
  assert new.x.shape[:3] == (2, 4, 7) and new.x_test.shape[:3] == (2, 4, 50)
  np.testing.assert_array_equal(new.counts, [[3] * 4, [7] * 4])
  np.testing.assert_array_equal(new.test_counts, np.full((2, 4), 50))
  np.testing.assert_array_equal(new.x[0, :, :3], new.x[1, :, :3])  # 7 extends 3
  assert not np.array_equal(new.x[1, 0], new.x[1, 1])  # each client its own draw
  nx, ny, nx_test, _ = transfer.transformed(arrays, 10)
  row = np.flatnonzero(np.all(nx == np.asarray(new.x[1, 0, 0]), axis=(1, 2, 3)))
  assert len(row) >= 1 and ny[row[0]] == int(new.y[1, 0, 0])
  assert probe.shape == (30, 8, 8, 1) and all(
      np.any(np.all(nx_test == p, axis=(1, 2, 3))) for p in probe)


def test_checks_before_any_work():
  with pytest.raises(cfg.ConfigError, match="finetune_samples=5000 is more than the"):
    recipe_registry.resolve("fedavg-ft-fig5", overrides=["finetune_samples=10,5000"])
  with pytest.raises(cfg.ConfigError, match="classes_per_client=11 is more than the 10"):
    recipe_registry.resolve("fedavg-ft-fig2", overrides=["classes_per_client=11"])
  with pytest.raises(cfg.ConfigError, match="finetune must be one of model, head"):
    recipe_registry.resolve("fedavg-ft-fig5", overrides=["finetune=body"])
  assert recipe_registry.resolve("fedavg-ft-fig2").new_dataset == transfer.TRANSFORMED


@pytest.mark.slow  # the fast tier keeps test_cka.py's layer CKA of one model and a changed one
def test_without_fine_tuning_every_layer_is_unchanged():
  """fig2's program with 0 epochs: every layer's CKA is 1, and the new clients' accuracy is
  the global model's on their test samples; with epochs the layers move, the first least
  (a random model: its head changes most)."""
  config = recipe_registry.resolve("fedavg-ft-fig2", quick=True, overrides=[
      "transfer_clients=2", "finetune_samples=20", "new_test_samples=40"])
  _, new, probe = transfer.seed_data(config, digits.load(0), 0, probe_samples=60)
  model = models.make_model("digits-mlp", 10)
  algorithm = nn_algorithms.make_algorithm("fedavg-steps", model=model, cohort=2,
                                           batch_size=10, local_steps=3)
  flat = params_lib.flatten(models.init_params(model, jax.random.key(0), (8, 8, 1)))
  stacked = lambda tree: jax.tree.map(lambda leaf: leaf[None], tree)
  two = jax.tree.map(lambda leaf: leaf[None, None], flat)  # [A=1, S=1, ...]
  data = stacked(jax.tree.map(lambda leaf: leaf[0], new))  # [S=1, J, ...]
  hp = hparams_lib.hparams(lr=0.5, momentum=0.0, weight_decay=0.0)
  keys = jax.random.split(jax.random.key(1), 1)
  untouched = fig2.analyse(algorithm, two, probe[None], data, hp, keys, epochs=0)
  np.testing.assert_allclose(untouched["cka"], np.ones((1, 1, 2, 3)), rtol=1e-5)
  logits = model.apply({"params": params_lib.unflatten(flat)}, new.x_test[0, 0])
  expected = np.mean(np.argmax(logits, -1) == new.y_test[0, 0])
  np.testing.assert_allclose(untouched["accuracy"][0, 0], expected, rtol=1e-6)
  moved = np.asarray(fig2.analyse(algorithm, two, probe[None], data, hp, keys,
                                  epochs=5)["cka"])[0, 0]
  assert np.all(moved < 1 - 1e-3) and np.all(moved[:, 0] > moved[:, -1])


def rows_of(name_values):
  """Analysis and training rows of two seeds, seed 1 diverged."""
  rows = []
  for name in compared.COMPARED:
    for seed, value, diverged in ((0, 0.5, 0), (1, np.nan, 3)):
      base = {"algorithm": name, "seed": seed, "round": 5}
      rows.append({**base, "diverged_round": diverged, "test_accuracy": value,
                   "train_loss": 1.0})
      rows += [{**base, **{k: value if isinstance(v, float) else v for k, v in row.items()}}
               for row in name_values]
  return rows


def test_the_summaries_leave_out_diverged_runs():
  config = recipe_registry.resolve("fedavg-ft-fig2", quick=True, overrides=["rounds=5",
                                                                            "local_steps=1"])
  rows = rows_of([{"layer": "fc1", "cka": 0.0}, {"layer": "head", "cka": 0.0},
                  {"finetune_samples": 100, "new_client_accuracy": 0.0}])
  table = fig2.summarize(rows, config)
  assert [(r["algorithm"], r["layer"], r["seeds"], r["diverged"]) for r in table] == [
      (name, layer, 1, 1) for name in compared.COMPARED for layer in ("fc1", "head")]
  assert all(r["cka"] == r["new_client_accuracy"] == r["final_test_accuracy"] == 0.5
             and r["cka_std_over_seeds"] == 0 for r in table)
  config = recipe_registry.resolve("fedavg-ft-fig5", quick=True, overrides=[
      "rounds=5", "local_steps=1", "finetune_samples=10"])
  rows = rows_of([{"finetune_samples": 10, "new_client_accuracy": 0.0,
                   "new_client_accuracy_std": 0.0}])
  table = fig5.summarize(rows, config)
  assert [(r["algorithm"], r["finetune_samples"], r["seeds"]) for r in table] == [
      (name, 10, 1) for name in compared.COMPARED]
  assert all(r["new_client_accuracy"] == 0.5 and r["new_client_accuracy_std_over_clients"]
             == 0.5 for r in table)


def test_the_pooled_std_is_over_every_new_client():
  """Two seeds of new clients with means 0.4 and 0.6 and stds 0.1 each: the std over all of
  them is sqrt(0.1^2 + 0.1^2)."""
  config = recipe_registry.resolve("fedavg-ft-fig5", quick=True, overrides=[
      "finetune_samples=10"])
  rows = []
  for name in compared.COMPARED:
    for seed, mean in ((0, 0.4), (1, 0.6)):
      rows += [{"algorithm": name, "seed": seed, "round": 1, "train_loss": 1.0,
                "diverged_round": 0},
               {"algorithm": name, "seed": seed, "round": 1, "finetune_samples": 10,
                "new_client_accuracy": mean, "new_client_accuracy_std": 0.1}]
  for entry in fig5.summarize(rows, config):
    assert math.isclose(entry["new_client_accuracy"], 0.5)
    assert math.isclose(entry["new_client_accuracy_std_over_seeds"], 0.1)
    assert math.isclose(entry["new_client_accuracy_std_over_clients"], math.sqrt(0.02))


def read(path):
  with open(path) as f:
    return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.parametrize("name,summary", [("fedavg-ft-fig2", "cka.csv"),
                                          ("fedavg-ft-fig5", "transfer.csv")])
def test_recipe_quick(name, summary, tmp_path):
  """--quick (2 seeds) writes metrics.csv with the training rows and the analysis rows of
  every algorithm and seed, the summary and the figure; the numbers are in range."""
  assert cli.main(["run", name, "--quick", "--seeds", "2", "--no-progress",
                   "--out", str(tmp_path)]) == 0
  config = recipe_registry.resolve(name, quick=True)
  rows = read(tmp_path / "metrics.csv")
  training = [r for r in rows if r["train_loss"]]
  assert len(training) == 2 * config.rounds * (1 + config.local_steps)
  assert all(np.isfinite(float(r["train_loss"])) for r in training)
  table = read(tmp_path / summary)
  if name == "fedavg-ft-fig2":
    layers = [r for r in rows if r["layer"]]
    assert sorted({(r["algorithm"], r["seed"]) for r in layers}) == [
        (a, s) for a in compared.COMPARED for s in ("0", "1")]
    assert [r["layer"] for r in layers[:3]] == ["fc1", "fc2", "head"]
    assert all(0.0 <= float(r["cka"]) <= 1.0 + 1e-5 for r in layers)
    assert [(r["algorithm"], r["layer"]) for r in table] == [
        (a, layer) for a in compared.COMPARED for layer in ("fc1", "fc2", "head")]
  else:
    assert [(r["algorithm"], int(r["finetune_samples"])) for r in table] == [
        (a, k) for a in compared.COMPARED for k in config.finetune_samples]
  tuned = [float(r["new_client_accuracy"]) for r in rows if r["new_client_accuracy"]]
  assert tuned and all(0.0 <= v <= 1.0 for v in tuned)
  assert all(float(r["final_test_accuracy"]) > 0.5 for r in table)
  assert (tmp_path / f"{name}.png").stat().st_size > 0


def tiny(classes, seed):
  """400 random 8x8 images of `classes` classes (300 train, 100 test), the class in their
  brightness."""
  rng = np.random.default_rng(seed)
  y = (np.arange(400) % classes).astype(np.int32)
  x = (0.3 * rng.random((400, 8, 8, 1)) + (y / classes)[:, None, None, None]).astype(
      np.float32)
  return x[:300], y[:300], x[300:], y[300:]


@pytest.mark.slow
def test_another_registered_dataset_as_the_new_clients(tmp_path, monkeypatch):
  """dataset and new_dataset any registered datasets (the paper's cifar100 -> cifar10 path):
  trained on one of 4 classes, new clients from one of 3 (within the model's outputs); one
  with more classes than the model has outputs is refused before any work."""
  from fedjax_rep.data import datasets
  for name, classes in (("tiny-a", 4), ("tiny-b", 3), ("tiny-c", 6)):
    monkeypatch.setitem(datasets.DATASETS, name, datasets.Dataset(
        name, "random images", lambda seed, c=classes: tiny(c, c), classes))
  with pytest.raises(cfg.ConfigError, match="new_dataset=tiny-c has 6 classes, more than the "
                                            "4 outputs"):
    recipe_registry.resolve("fedavg-ft-fig5", overrides=["dataset=tiny-a",
                                                         "new_dataset=tiny-c"])
  assert cli.main(["run", "fedavg-ft-fig5", "--quick", "--seeds", "1", "--no-progress",
                   "--out", str(tmp_path), "--set", "dataset=tiny-a", "--set",
                   "new_dataset=tiny-b", "--set", "num_clients=10", "--set", "rounds=10",
                   "--set", "finetune_samples=5,20", "--set", "new_test_samples=30"]) == 0
  table = read(tmp_path / "transfer.csv")
  assert [(r["algorithm"], int(r["finetune_samples"])) for r in table] == [
      (a, k) for a in compared.COMPARED for k in (5, 20)]
  assert all(0.0 <= float(r["new_client_accuracy"]) <= 1.0 for r in table)
