"""The Table-1 recipes: Synthetic(alpha, beta) outcomes, the real-data recipes on mock data,
the one-line stop without data, and table1.csv with the paper's numbers."""

import csv
import dataclasses
import time

import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.kit import table
from fedjax_rep.recipes.fedrep import paper


def table_by(rows, config, dataset, settings):
  """{(algorithm, setting index): table row} of table1.table."""
  out = {}
  for entry in table.table(rows, config, dataset, settings, paper.PAPER):
    index = next(i for i, s in enumerate(settings) if all(entry[k] == v for k, v in s.items()))
    out[entry["algorithm"], index] = entry
  return out


def test_paper_table_has_every_algorithm_and_column():
  assert len(paper.PAPER) == 7
  for column in paper.PAPER.values():
    assert set(column) == set(paper.PAPER_ALGORITHMS) == set(paper.DEFAULT_ALGORITHMS) - {"fedbabu"}
    assert all(0 < v < 1 for v in column.values())
  assert table.paper_accuracy("femnist", {"num_clients": 150, "classes_per_client": 3},
                              "fed-mtl", paper.PAPER) == pytest.approx(0.5411)
  assert table.paper_accuracy("cifar10", {"num_clients": 100, "classes_per_client": 2},
                              "fedbabu", paper.PAPER) is None
  assert table.paper_accuracy("cifar10", {"num_clients": 1000, "classes_per_client": 2},
                              "fedrep", paper.PAPER) == pytest.approx(0.8327)
  assert table.paper_accuracy("sent140", {"num_clients": 183}, "fedper",
                              paper.PAPER) == pytest.approx(0.7212)
  assert table.paper_accuracy("cifar10", {"num_clients": 10, "classes_per_client": 2},
                              "fedrep", paper.PAPER) is None
  assert table.paper_accuracy("synthetic", {"num_clients": 100}, "fedrep", paper.PAPER) is None


@pytest.mark.parametrize("recipe,env,command", [
    ("fedrep-table1-cifar10", "TFDS_DATA_DIR", "tfds build cifar10"),
    ("fedrep-table1-cifar100", "TFDS_DATA_DIR", "tfds build cifar100"),
    ("fedrep-table1-femnist", "FEDJAX_REP_LEAF_DIR", "preprocess.sh"),
    ("fedrep-table1-sent140", "FEDJAX_REP_LEAF_DIR", "preprocess.sh"),
])
def test_without_data_the_run_stops_at_once_with_the_command(recipe, env, command, tmp_path,
                                                              monkeypatch, capsys):
  monkeypatch.setenv(env, str(tmp_path / "empty"))
  start = time.perf_counter()
  assert cli.main(["run", recipe, "--no-progress", "--out", str(tmp_path / "out")]) == 2
  assert time.perf_counter() - start < 5
  message = capsys.readouterr().err.strip()
  assert message.count("\n") == 0 and command in message and "needs internet" in message
  assert not (tmp_path / "out").exists()  # stopped before any work


@pytest.mark.parametrize("recipe,items,pattern", [
    ("table1-synthetic", ["alpha=0,1"], "alpha and beta pair up"),
    ("table1-synthetic", ["algorithms=fedrep,fedmtl"], "algorithms='fedmtl' is out of range"),
    ("table1-synthetic", ["l2gd_p=1"], "l2gd_p=1.0 is out of range"),
    ("table1-synthetic", ["mtl_lambda=-1"], r"mtl_lambda=-1.0 is out of range: mtl_lambda must "
                                            r"be finite and >= 0"),
    ("table1-synthetic", ["mtl_lambda=big"], "'big' is not valid"),
    ("table1-synthetic", ["mtl_omega=identity"], "mtl_omega='identity' is out of range"),
    ("flute-table1", ["fedcp_lambda=-1"], "fedcp_lambda=-1.0 is out of range"),
    ("fedrep-table1-cifar10", ["num_clients=100", "source=mock"], "num_clients and "
                                                                  "classes_per_client pair up"),
])
def test_config_errors(recipe, items, pattern, compiles):
  with pytest.raises(cfg.ConfigError, match=pattern):
    fr.run_recipe(recipe, overrides=items, progress=False)
  assert compiles.count == 0


def test_mtl_lambda_is_a_traced_option_or_the_algorithms_default():
  from fedjax_rep.recipes.kit import neural as nn_common
  from fedjax_rep.recipes.fedrep import table1_synthetic as table1_synthetic
  config = cfg.override(table1_synthetic.Config(), ["mtl_lambda=auto"])
  assert "mtl_lambda" not in dict(config.options) and nn_common.hparams(config).options == {}
  config = cfg.override(config, ["mtl_lambda=0.02"])
  assert float(nn_common.hparams(config).options["mtl_lambda"]) == pytest.approx(0.02)


def test_config_json_records_every_declared_option_at_the_value_run():
  config = fr.resolve("fedrep-table1-cifar10", quick=True, overrides=[
      "algorithms=fedrep,fedprox,fed-mtl,l2gd", "prox_mu=0.1"])
  record = config.record(cfg.sweep(config, {}))["options"]
  assert record == {"prox_mu": 0.1, "mtl_lambda": "auto", "mtl_omega": "ones",
                    "l2gd_p": 0.2, "l2gd_lambda": 10.0}


@pytest.mark.slow
def test_table1_synthetic_quick(tmp_path):
  """FedRep beats FedAvg on Synthetic(1, 1); every accuracy is finite and in [0, 1]. (The
  CLI's --quick runs the six algorithms of one program, QUICK_ALGORITHMS; here four, one
  of them outside it, to keep CI short: the baselines are checked against their
  references in test_baselines_reference.py.)"""
  algorithms = "local,fedavg,l2gd,fedrep"
  out = cli.main(["run", "table1-synthetic", "--quick", "--no-progress", "--out",
                  str(tmp_path), "--set", f"algorithms={algorithms}"])
  assert out == 0
  with open(tmp_path / "table1.csv") as f:
    table = list(csv.DictReader(f))
  assert len(table) == 3 * 4 and {r["paper_test_accuracy"] for r in table} == {""}
  accuracy = {(r["algorithm"], float(r["alpha"])): float(r["test_accuracy"]) for r in table}
  assert all(0 <= a <= 1 for a in accuracy.values())
  assert accuracy["fedrep", 1.0] > accuracy["fedavg", 1.0] + 0.1
  assert (tmp_path / "table1-synthetic.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("recipe,overrides", [  # few programs each, to keep CI short
    ("fedrep-table1-cifar10", ["algorithms=fedavg-ft,fedrep"]),
    ("fedrep-table1-cifar100", ["algorithms=fedrep", "num_clients=10", "classes_per_client=5"]),
    ("fedrep-table1-femnist", ["algorithms=fedrep"]),
    ("fedrep-table1-sent140", ["algorithms=fedrep"]),
])
def test_real_data_recipes_quick_on_mock_data(recipe, overrides, capsys):
  rows, config = fr.run_recipe(recipe, quick=True, progress=False, overrides=overrides)
  assert config.source == "mock"
  assert f"fedjax-rep: {recipe} runs on mock data (" in capsys.readouterr().err
  from fedjax_rep.experiments import recipe_registry
  summary = recipe_registry.get(recipe).summarize(rows, config)
  assert {r["algorithm"] for r in summary} == set(config.algorithms)
  for r in summary:
    assert 0 <= r["test_accuracy"] <= 1 and np.isfinite(r["test_accuracy"])
  evaluated = [r for r in rows if r.get("test_accuracy") is not None]
  assert {r["round"] for r in evaluated} == set(range(1, config.rounds + 1))


@pytest.mark.slow
def test_flute_table1_quick_on_digits():
  """FLUTE's recipe on digits: accuracies in [0, 1], the NC2 metrics in metrics.csv for
  FLUTE only, FLUTE Table 1's numbers only where the paper has the setting (none here)."""
  rows, config = fr.run_recipe("flute-table1", quick=True, progress=False,
                               overrides=["algorithms=fedrep,flute", "num_clients=20",
                                          "classes_per_client=5"])
  from fedjax_rep.recipes.flute import table1 as flute_table1
  table = flute_table1.summarize(rows, config)
  assert {r["algorithm"] for r in table} == {"fedrep", "flute"}
  assert all(0 <= r["test_accuracy"] <= 1 and r["paper_test_accuracy"] == "" for r in table)
  evaluated = [r for r in rows if r.get("test_accuracy") is not None]
  assert all(np.isfinite(r["global_nc2"]) and r["global_nc2"] > 0
             for r in evaluated if r["algorithm"] == "flute")
  assert not any("global_nc2" in r for r in rows if r["algorithm"] == "fedrep")
  assert flute_table1.PAPER["cifar10", 100, 5]["flute-star"] == pytest.approx(0.78255)


def test_summaries_say_how_many_evaluations_they_average():
  """After 3 evaluations the summary averages 3 and says so; after 12, the last 10."""
  from fedjax_rep.recipes.kit import summaries
  rows = [{"algorithm": "fedrep", "seed": s, "round": t, "test_accuracy": 0.1 * t}
          for s in (0, 1) for t in (1, 2, 3)]
  entry, = summaries.summary(rows, ["fedrep"])
  assert entry["last_evaluations"] == 3 and entry["test_accuracy"] == pytest.approx(0.2)
  assert summaries.averaged_text(rows) == "mean of all 3 evaluations"
  rows = [{"algorithm": "fedrep", "seed": 0, "round": t, "test_accuracy": float(t)}
          for t in range(1, 13)]
  entry, = summaries.summary(rows, ["fedrep"])
  assert entry["last_evaluations"] == 10 and entry["test_accuracy"] == pytest.approx(7.5)
  assert entry["statistic"] == "mean of the last 10 evaluations"
  assert summaries.averaged_text(rows) == "mean of the last 10 evaluations"


def test_mock_data_is_said_for_exactly_the_configurations_that_train_on_it():
  """fedrep-table1-* with source=mock (as --quick sets) and flute-table1 on CIFAR with
  source=mock say one line; the real files, and flute-table1 --quick (digits), none."""
  from fedjax_rep.experiments import recipe_registry
  from fedjax_rep.experiments import runner
  quick = {name: runner.mock_lines(recipe_registry.get(name),
                                   [recipe_registry.resolve(name, quick=True)])
           for name in recipe_registry.all_recipes()}
  assert {name for name, lines in quick.items() if lines} == {
      f"fedrep-table1-{d}" for d in ("cifar10", "cifar100", "femnist", "sent140")}
  assert quick["fedrep-table1-femnist"] == [
      "fedjax-rep: fedrep-table1-femnist runs on mock data (random examples in the format of "
      "FEMNIST (10 letters)), not the real dataset (source=mock, as --quick sets): its numbers "
      "mean nothing; `fedjax-rep data` says how to get the data"]
  flute = recipe_registry.get("flute-table1")
  config = flute.config(dataset="cifar10", source="mock")
  assert runner.mock_lines(flute, [config]) == [
      "fedjax-rep: flute-table1 runs on mock data (random examples in the format of cifar10), "
      "not the real dataset (source=mock, as --quick sets): its numbers mean nothing; "
      "`fedjax-rep data` says how to get the data"]
  both = [dataclasses.replace(config, source=source) for source in ("files", "mock")]
  assert runner.mock_lines(flute, both) == runner.mock_lines(flute, [config])  # once
  assert runner.mock_lines(flute, [flute.config(dataset="cifar10")]) == []


class Trained(Exception):
  """Raised where a recipe would start training."""


def test_the_mock_data_line_comes_before_training(monkeypatch, capsys, tmp_path):
  """`fedjax-rep run fedrep-table1-cifar10 --quick` says on stderr that it runs on mock
  data before it trains (here: stops where training starts)."""
  said = []

  def shard_run(*args):
    said.append(capsys.readouterr().err)
    raise Trained

  monkeypatch.setattr(table, "shard_run", shard_run)
  with pytest.raises(Trained):
    cli.main(["run", "fedrep-table1-cifar10", "--quick", "--no-progress", "--out",
              str(tmp_path / "out")])
  assert said == [
      "fedjax-rep: fedrep-table1-cifar10 runs on mock data (random examples in the format of "
      "CIFAR-10), not the real dataset (source=mock, as --quick sets): its numbers mean "
      "nothing; `fedjax-rep data` says how to get the data\n"]


def test_summaries_take_the_last_or_the_best_evaluation_when_asked():
  """summary="last": each seed's last accuracy; "best": its largest; both named."""
  from fedjax_rep.recipes.kit import summaries
  rows = [{"algorithm": "fedrep", "seed": s, "round": t, "test_accuracy": a}
          for s, curve in ((0, (0.2, 0.9, 0.5)), (1, (0.4, 0.3, 0.7)))
          for t, a in zip((5, 10, 15), curve)]
  last, = summaries.summary(rows, ["fedrep"], "last")
  best, = summaries.summary(rows, ["fedrep"], "best")
  assert last["test_accuracy"] == pytest.approx(0.6) and last["last_evaluations"] == 1
  assert best["test_accuracy"] == pytest.approx(0.8) and best["last_evaluations"] == 3
  assert (last["statistic"], best["statistic"]) == ("last evaluation", "best of 3 evaluations")
  assert summaries.averaged_text(rows, "best") == "best of 3 evaluations"


def test_one_table_of_labels_names_every_method_once():
  """`labels.label`: the papers' spelling (FedAvg + FT everywhere), FedAvg's local steps
  for the linear 'fedavg-tauN', a plugin's name as it is; a Table-1 figure adds "(not in
  paper)" to a method its paper has no row of."""
  from fedjax_rep.experiments import labels
  assert labels.label("fedavg-ft") == "FedAvg + FT" and labels.label("local") == "Local only"
  assert labels.label("fedavg-tau5") == "FedAvg, τ = 5"
  assert labels.label("my-method") == "my-method"
  assert table.label("fedbabu", paper.PAPER) == "FedBABU (not in paper)"
  assert table.label("fedrep", paper.PAPER) == "FedRep"
