"""The dataset registry (`data.datasets`): a plugin file that registers a dataset and
nothing else runs in a dataset-taking recipe; the registry's mistakes are one-line errors
naming the argument; the model is chosen by the input shape unless named."""

import csv
import json

import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.data import datasets
from fedjax_rep.experiments import plugins
from fedjax_rep.nn import models
from fedjax_rep.recipes.kit import neural

PLUGIN = '''"""Gaussian blobs: 16-d vectors around 6 class centres."""
import numpy as np

import fedjax_rep as fr


def load(seed):
  rng = np.random.default_rng(0)
  centres = rng.normal(size=(6, 16)).astype(np.float32)
  y = rng.integers(0, 6, 600).astype(np.int32)
  x = centres[y] + 0.5 * rng.normal(size=(600, 16)).astype(np.float32)
  return x[:500], y[:500], x[500:], y[500:]


fr.register_dataset("blobs", "Gaussian blobs: 16-d vectors, 6 classes", load, 6)
'''


def blobs(seed):
  rng = np.random.default_rng(seed)
  return (rng.random((40, 4), np.float32), rng.integers(0, 3, 40), rng.random((8, 4), np.float32),
          rng.integers(0, 3, 8))


@pytest.fixture(autouse=True)
def registry_restored():
  """Each test starts and ends with the package's datasets only (no plugin loaded)."""
  before = dict(datasets.DATASETS)
  yield
  datasets.DATASETS.clear()
  datasets.DATASETS.update(before)
  plugins.LOADED.clear()


@pytest.mark.slow  # the fast tier keeps the registry's checks and entries
def test_a_plugin_dataset_runs_in_fedrep_table1_cifar10(tmp_path, capsys):
  plugin = tmp_path / "blobs.py"
  plugin.write_text(PLUGIN)
  out = tmp_path / "out"
  assert cli.main(["run", "fedrep-table1-cifar10", "--quick", "--plugin", str(plugin),
                   "--set", "dataset=blobs", "--set", "num_clients=10",
                   "--set", "classes_per_client=2", "--seeds", "1", "--no-progress",
                   "--out", str(out)]) == 0
  with open(out / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  assert {r["algorithm"] for r in rows} == {"local", "fedavg-ft", "fedrep"}
  accuracies = [float(r["test_accuracy"]) for r in rows if r["test_accuracy"]]
  assert accuracies and all(0 <= a <= 1 for a in accuracies)
  saved = json.loads((out / "config.json").read_text())
  assert saved["config"]["dataset"] == "blobs"
  assert saved["plugins"][0]["path"] == str(plugin)
  assert (out / "fedrep-table1-cifar10.png").stat().st_size > 0
  capsys.readouterr()
  assert cli.main(["list", "--plugin", str(plugin)]) == 0
  listing = capsys.readouterr().out
  assert "datasets (--set dataset=NAME" in listing
  assert "  blobs" in listing and "  cifar10" in listing


def test_every_dataset_taking_recipe_accepts_a_registered_name():
  datasets.register("blobs", "random 4-d vectors, 3 classes", blobs, 3)
  for recipe in ("fedrep-table1-cifar10", "fedrep-table1-cifar100", "flute-table1",
                 "srpfl-neural", "digits-personalized"):
    config = fr.resolve(recipe, overrides=["dataset=blobs", "num_clients=4",
                                           "classes_per_client=2"])
    assert config.dataset == "blobs", recipe
  with pytest.raises(fr.ConfigError, match="dataset='nope' is out of range: dataset must be "
                                           "one of digits, cifar10, .*, blobs"):
    fr.resolve("digits-personalized", overrides=["dataset=nope"])


def test_unknown_names_list_the_registered_ones():
  with pytest.raises(ValueError, match=r"unknown dataset 'nope'; registered datasets: digits, "
                                       r"cifar10, cifar100, emnist, femnist \(register yours"):
    datasets.lookup("nope")


def test_a_taken_name_is_refused_unless_the_same_function_again():
  with pytest.raises(ValueError, match="dataset 'digits' is registered already"):
    datasets.register("digits", "mine", blobs, 3)
  datasets.register("blobs", "first", blobs, 3)
  datasets.register("blobs", "again, from the same cell", blobs, 3)  # replaces itself
  assert datasets.lookup("blobs").summary == "again, from the same cell"
  with pytest.raises(ValueError, match="dataset 'blobs' is registered already"):
    datasets.register("blobs", "another function", lambda seed: blobs(seed), 3)


@pytest.mark.parametrize("arguments, message", [
    (dict(name="two words"), "name must be letters, digits"),
    (dict(name=""), "name must be letters, digits"),
    (dict(summary="two\nlines"), "summary must be one line of text"),
    (dict(load="blobs.npz"), "load must be a function, got str"),
    (dict(num_classes=1), "num_classes must be an integer >= 2"),
    (dict(num_classes=2.5), "num_classes must be an integer >= 2"),
    (dict(model=3), "model must be a model's name"),
    (dict(seeded="yes"), "seeded must be True or False"),
    (dict(mock=4), "mock must be a function \\(or None\\)"),
    (dict(status="present"), "status must be a function \\(or None\\)"),
])
def test_bad_arguments_are_named(arguments, message):
  given = {"name": "blobs", "summary": "random vectors", "load": blobs, "num_classes": 3,
           **arguments}
  with pytest.raises(ValueError, match=message):
    datasets.register(given.pop("name"), given.pop("summary"), given.pop("load"),
                      given.pop("num_classes"), **given)
  assert "blobs" not in datasets.DATASETS


def test_arrays_that_do_not_fit_are_named_before_any_work():
  datasets.register("bad-labels", "labels past num_classes", blobs, 2)
  with pytest.raises(ValueError, match=r"dataset 'bad-labels': the labels of \(x, y\) span "
                                       r"\[0, 2\], outside \[0, 2\)"):
    datasets.arrays("bad-labels", 0)
  datasets.register("bad-shapes", "x_test of another shape",
                    lambda seed: (*blobs(seed)[:2], np.zeros((8, 5), np.float32),
                                  blobs(seed)[3]), 3)
  with pytest.raises(ValueError, match="x_test's examples have shape"):
    datasets.arrays("bad-shapes", 0)
  datasets.register("two", "two arrays", lambda seed: blobs(seed)[:2], 3)
  with pytest.raises(ValueError, match=r"load must return \(x, y, x_test, y_test\)"):
    datasets.arrays("two", 0)


def test_the_model_is_chosen_by_the_input_shape_unless_named():
  assert [models.model_for(s) for s in ((32, 32, 3), (28, 28, 1), (8, 8, 1), (12, 12, 2),
                                         (60,))] == [
      "cifar10-cnn", "mlp", "digits-mlp", "mlp", "synthetic-mlp"]
  with pytest.raises(ValueError, match="no model is chosen for inputs of shape \\(4, 4\\)"):
    models.model_for((4, 4))
  datasets.register("blobs", "random 4-d vectors, 3 classes", blobs, 3)
  model = neural.dataset_model("blobs", (4,), "float32")
  assert model.num_classes == 3 and model.body.example_axes == 1
  assert neural.dataset_model("cifar100", (32, 32, 3), "float32").num_classes == 100
  assert neural.dataset_model("blobs", (4,), "float32", "mlp").body.fcs == (512, 256, 64)
  datasets.register("named", "a dataset naming a model the package lacks", blobs, 3,
                    model="resnet")
  with pytest.raises(fr.ConfigError, match="dataset named names model 'resnet', which is "
                                           "none of"):
    neural.check_dataset("named")


def test_a_seeded_dataset_loads_per_seed_the_others_once():
  calls = []
  datasets.register("counted", "counts its loads", lambda seed: (calls.append(seed),
                                                                 blobs(seed))[1], 3)
  pooled = datasets.by_seed("counted", 7)
  pooled(0), pooled(1)
  assert calls == [7]
  datasets.register("counted", "counts its loads", datasets.lookup("counted").load, 3,
                    seeded=True)
  pooled = datasets.by_seed("counted", 7)
  pooled(0), pooled(1)
  assert calls == [7, 0, 1]
