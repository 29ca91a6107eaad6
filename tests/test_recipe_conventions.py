"""The recipes' training conventions (`nn.conventions`): the Table-1 recipes default to the
authors' code's, the others to the papers'; what reaches the engine; what config.json and
the figure's title say."""

import csv
import json

import pytest

from fedjax_rep import cli
from fedjax_rep.nn import conventions
from fedjax_rep.nn import algorithms as nn_algorithms
from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.kit import neural
from fedjax_rep.experiments import recipe_registry

# (fedrep-fig6 trains in fedrep-table1-femnist's setting, so with its conventions.)
TABLE1 = ("fedrep-table1-cifar10", "fedrep-table1-cifar100", "fedrep-table1-femnist",
          "fedrep-table1-sent140", "flute-table1", "table1-synthetic", "fedrep-fig6")
LEAF = ("fedrep-table1-femnist", "fedrep-table1-sent140", "table1-synthetic", "fedrep-fig6")


def recipe_config(name):
  return recipe_registry.default_config(recipe_registry.get(name))


def test_table1_recipes_default_to_the_authors_and_the_others_to_the_papers():
  with_conventions = [n for n in recipe_registry.all_recipes()
                      if hasattr(recipe_config(n), "conventions")]
  assert set(TABLE1) <= set(with_conventions)
  assert {"digits-personalized", "srpfl-neural"} <= set(with_conventions)
  for name in with_conventions:
    config = recipe_config(name)
    resolved = neural.resolved_conventions(config)
    if name in TABLE1:
      assert config.conventions == "authors"
      averaging = "samples" if name in LEAF else "uniform"  # FedRep's code on LEAF: counts
      assert resolved == conventions.resolve("authors", averaging=averaging), name
    else:
      assert config.conventions == "paper" and resolved == conventions.PRESETS["paper"], name


def test_a_knob_changes_one_convention_of_the_preset():
  config = cfg.override(recipe_config("flute-table1"), ["dataset=digits", "conventions=paper",
                                                         "feature_penalty=sum"])
  resolved = neural.resolved_conventions(config)
  assert resolved == conventions.resolve("paper", feature_penalty="sum")
  assert neural.conventions_text(config) == "paper conventions (feature_penalty=sum)"
  config = cfg.override(config, ["conventions=authors", "feature_penalty=auto"])
  assert neural.conventions_text(config) == "authors' conventions"
  assert neural.conventions_text(recipe_config("fedrep-table1-femnist")) == (
      "authors' conventions (averaging=samples)")
  with pytest.raises(cfg.ConfigError, match="feature_penalty must be one of mean, sum"):
    cfg.override(config, ["feature_penalty=avg"])


def make(name, config):
  from fedjax_rep.nn import models
  return neural.algorithm(name, config, models.make_model("digits-mlp", 10), 20)


def test_what_reaches_the_engine():
  """The authors' conventions: every flag for FLUTE* (and FLUTE*'s head-first field); for
  Ditto only those it declares (not FLUTE's feature_sum, nor average_untrained: its code
  does not alias heads); the papers': no flag, FLUTE* joint-first."""
  config = recipe_config("flute-table1")
  flute_star, ditto = make("flute-star", config), make("ditto", config)
  assert flute_star.head_first
  assert neural.resolved_conventions(config).options(flute_star) == {
      "feature_sum": 1.0, "average_untrained": 1.0, "no_bias_decay": 1.0,
      "uniform_average": 1.0}
  assert neural.resolved_conventions(config).options(ditto) == {
      "no_bias_decay": 1.0, "uniform_average": 1.0}
  paper = cfg.override(config, ["dataset=digits", "conventions=paper"])
  assert not make("flute-star", paper).head_first
  assert neural.resolved_conventions(paper).options(make("flute-star", paper)) == {}
  with pytest.raises(ValueError, match="average_untrained"):
    nn_algorithms.make_algorithm("ditto", model=ditto.model, cohort=2).check(
        None, neural.hparams(config).replace(options={"average_untrained": 1.0}))


def test_config_json_records_the_conventions_of_each_grid_combination():
  config = cfg.override(recipe_config("flute-table1"), ["dataset=digits"])  # no files needed
  assert config.record(cfg.sweep(config, {}))["conventions"] == {
      "preset": "authors", **conventions.PRESETS["authors"].described()}
  record = config.record(cfg.sweep(config, {"conventions": ("paper", "authors")}))
  assert record["conventions"]["conventions=paper"]["averaging"] == "samples"
  assert record["conventions"]["conventions=authors"]["averaging"] == "uniform"
  linear = recipe_registry.resolve("fedrep-fig3")
  assert linear.record(cfg.sweep(linear, {})) == {}


@pytest.mark.slow
def test_flute_table1_under_both_conventions(tmp_path):
  """One run with `--grid conventions=paper,authors`: config.json has both, and FLUTE*'s
  numbers differ between them (the conventions reach the run)."""
  assert cli.main(["run", "flute-table1", "--quick", "--no-progress", "--out", str(tmp_path),
                   "--set", "algorithms=flute-star", "--set", "num_clients=20",
                   "--set", "classes_per_client=2", "--set", "rounds=4",
                   "--grid", "conventions=paper,authors"]) == 0
  with open(tmp_path / "config.json") as f:
    record = json.load(f)["conventions"]
  assert record["conventions=authors"]["flute_star_order"] == "head-first"
  assert record["conventions=paper"]["flute_star_order"] == "joint-first"
  with open(tmp_path / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  loss = {(r["grid"], r["round"]): float(r["train_loss"]) for r in rows}
  assert loss["conventions=paper", "4"] != loss["conventions=authors", "4"]
