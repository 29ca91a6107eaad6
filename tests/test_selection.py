"""Hyperparameters chosen without the test set: `best` picks the round by validation,
--select the grid's combination by validation, never by test."""

import csv
import json
import math
import os

import numpy as np
import pytest

from fedjax_rep import cli
from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.kit import summaries
from fedjax_rep.experiments import selection


def rows_of(curves: dict) -> list[dict]:
  """metrics.csv-like rows: curves {(algorithm, lr): {seed: [(test, val), ...]}}, one
  evaluation per round."""
  rows = []
  for (name, lr), seeds in curves.items():
    for seed, evaluations in seeds.items():
      for t, (test, val) in enumerate(evaluations, 1):
        rows.append({"algorithm": name, "seed": seed, "round": t, "lr": lr,
                     "grid": f"lr={lr}", "test_accuracy": test, "val_accuracy": val,
                     "diverged_round": 0})
  return rows


# Validation prefers lr=0.1, test prefers lr=0.2 (for algorithm a); b agrees on lr=0.2.
CURVES = {("a", 0.1): {0: [(0.5, 0.6), (0.6, 0.8)], 1: [(0.5, 0.7), (0.6, 0.8)]},
          ("a", 0.2): {0: [(0.7, 0.5), (0.9, 0.6)], 1: [(0.8, 0.5), (0.9, 0.6)]},
          ("b", 0.1): {0: [(0.4, 0.4), (0.5, 0.5)], 1: [(0.4, 0.4), (0.5, 0.5)]},
          ("b", 0.2): {0: [(0.6, 0.6), (0.7, 0.7)], 1: [(0.6, 0.6), (0.7, 0.7)]}}


def entries(statistic="last"):
  rows = rows_of(CURVES)
  out = []
  for lr in (0.1, 0.2):
    for entry in summaries.summary([r for r in rows if r["lr"] == lr], ("a", "b"), statistic):
      out.append({**entry, "lr": lr, "grid": f"lr={lr}"})
  return out


def test_selection_follows_validation_where_test_disagrees():
  chosen = {row["algorithm"]: row for row in selection.choose(entries(), {"lr": (0.1, 0.2)})}
  assert chosen["a"]["lr"] == 0.1  # test would pick 0.2
  assert chosen["a"]["val_accuracy"] == pytest.approx(0.8)
  assert chosen["a"]["test_accuracy"] == pytest.approx(0.6)
  assert chosen["b"]["lr"] == 0.2
  assert chosen["a"]["combinations"] == 2


def test_best_picks_the_round_by_validation_and_reports_test_there():
  rows = rows_of({("a", 0.1): {0: [(0.9, 0.1), (0.2, 0.8), (0.5, 0.3)]}})
  entry = summaries.summary(rows, ("a",), "best")[0]
  assert entry["test_accuracy"] == pytest.approx(0.2)
  assert entry["val_accuracy"] == pytest.approx(0.8)
  assert entry["statistic"] == "test at the best validation of 3 evaluations"
  # Without a validation split, best is the largest test accuracy, as before.
  plain = [{k: v for k, v in r.items() if k != "val_accuracy"} for r in rows]
  assert summaries.summary(plain, ("a",), "best")[0]["test_accuracy"] == pytest.approx(0.9)


def test_rounds_to_95_counts_to_95_percent_of_the_statistic():
  rows = rows_of({("a", 0.1): {0: [(0.1, 0.2), (0.5, 0.77), (0.6, 0.8)]}})
  entry = summaries.summary(rows, ("a",), "last")[0]
  assert entry["rounds_to_95"] == 2  # 0.77 >= 0.95 * 0.8 (validation where split)
  plain = [{k: v for k, v in r.items() if k != "val_accuracy"} for r in rows]
  assert summaries.summary(plain, ("a",), "last")[0]["rounds_to_95"] == 3  # test: 0.5 < 0.57


def test_no_validation_score_is_a_one_line_error_naming_what_to_do():
  """A setting none of whose combinations has a finite val_accuracy (no validation split,
  or every run diverged) is an error, not the first combination chosen silently."""
  plain = [{k: v for k, v in e.items() if k != "val_accuracy"} for e in entries()]
  with pytest.raises(cfg.ConfigError, match=r"--select: no combination of algorithm=a has a "
                                            r"validation score .* give validation_fraction > 0"
                     ) as error:
    selection.choose(plain, {"lr": (0.1, 0.2)})
  assert "\n" not in str(error.value)
  diverged = [{**e, "val_accuracy": np.nan} if e["algorithm"] == "b" else e for e in entries()]
  with pytest.raises(cfg.ConfigError, match="no combination of algorithm=b"):
    selection.choose(diverged, {"lr": (0.1, 0.2)})


def test_confirmed_adds_the_fresh_seeds_test_statistic():
  grid = {"lr": (0.1, 0.2)}
  chosen = selection.choose(entries(), grid)
  fresh = [{"algorithm": "a", "lr": 0.1, "test_accuracy": 0.55,
            "test_accuracy_std_over_seeds": 0.01},
           {"algorithm": "b", "lr": 0.2, "test_accuracy": 0.66,
            "test_accuracy_std_over_seeds": 0.02}]
  out = {r["algorithm"]: r for r in selection.confirmed(chosen, fresh, grid, 3)}
  assert out["a"]["confirm_test_accuracy"] == 0.55
  assert out["b"]["confirm_test_accuracy_std_over_seeds"] == 0.02
  assert out["a"]["confirm_seeds"] == 3


@pytest.mark.parametrize("argv, message", [
    (["--grid", "lr=0.01,0.1", "--select"], "validation_fraction is 0"),
    (["--set", "validation_fraction=0.2", "--select"], "chooses among the combinations"),
    (["--grid", "lr=0.01,0.1", "--confirm-seeds", "2"], "give --select too"),
    (["--set", "validation_fraction=0.2", "--grid", "lr=0.01,0.1", "--select",
      "--confirm-seeds", "0"], "--confirm-seeds must be an integer >= 1"),
    (["--set", "validation_fraction=1"], "validation_fraction=1.0 is out of range"),
])
def test_selection_mistakes_are_one_line_before_any_work(argv, message, tmp_path, capsys,
                                                        compiles):
  out = tmp_path / "run"
  code = cli.main(["run", "digits-personalized", "--quick", "--no-progress", "--out",
                   str(out), *argv])
  err = capsys.readouterr().err.strip()
  assert code == 2 and message in err and len(err.splitlines()) == 1
  assert compiles.count == 0 and not out.exists()


def test_select_on_a_linear_recipe_is_refused():
  config = cfg.validate(__import__("fedjax_rep").resolve("fedrep-fig3", quick=True))
  with pytest.raises(cfg.ConfigError, match="only the neural recipes"):
    selection.check(config, {"lr": (0.1, 0.2)}, None)


@pytest.mark.slow
def test_select_writes_one_row_per_algorithm_chosen_on_validation(tmp_path, compiles):
  out = tmp_path / "run"
  code = cli.main(["run", "digits-personalized", "--quick", "--no-progress", "--seeds", "2",
                   "--set", "validation_fraction=0.2", "--set", "rounds=6",
                   "--set", "eval_every=2", "--set", "algorithms=fedrep,fedavg,local",
                   "--grid", "lr=0.01,0.03,0.1", "--grid", "momentum=0,0.5", "--select",
                   "--confirm-seeds", "1", "--out", str(out)])
  assert code == 0
  assert compiles.names.count("jit(_run_chunk)") <= 2  # the grid's program, the confirmations'
  with open(out / "metrics.csv") as f:
    metrics = list(csv.DictReader(f))
  assert {"val_accuracy", "val_accuracy_weighted", "val_accuracy_p10",
          "val_clients"} <= set(metrics[0])
  with open(out / "selection.csv") as f:
    chosen = list(csv.DictReader(f))
  assert [r["algorithm"] for r in chosen] == ["fedrep", "fedavg", "local"]
  with open(out / "summary.csv") as f:
    summary = list(csv.DictReader(f))
  for row in chosen:
    own = [e for e in summary if e["algorithm"] == row["algorithm"]]
    best = max(own, key=lambda e: float(e["val_accuracy"]))
    assert row["grid"] == best["grid"]  # the validation argmax, whatever test says
    assert float(row["test_accuracy"]) == pytest.approx(float(best["test_accuracy"]))
    assert not math.isnan(float(row["confirm_test_accuracy"]))
  with open(out / "config.json") as f:
    assert json.load(f)["select"] == {"confirm_seeds": 1}
  assert os.path.getsize(out / "selection.png") > 0


def test_a_choice_at_the_edge_of_the_grid_is_named_and_said():
  """A value the grid cannot go past is said (selection.csv's at_edge, one stderr line each):
  with 3 or more numbers only (2 values are always at an edge), never for a value inside."""
  scores = {"a": (0.9, 0.8, 0.7), "b": (0.5, 0.6, 0.7), "c": (0.5, 0.9, 0.6)}
  grid = {"lr": (0.05, 0.1, 0.2)}
  three = [{"algorithm": name, "lr": lr, "grid": f"lr={lr}", "val_accuracy": val,
            "val_accuracy_std_over_seeds": 0.0, "test_accuracy": 0.5,
            "test_accuracy_std_over_seeds": 0.0, "statistic": "last evaluation", "seeds": 2}
           for name, vals in scores.items() for lr, val in zip(grid["lr"], vals)]
  chosen = {row["algorithm"]: row for row in selection.choose(three, grid)}
  assert (chosen["a"]["lr"], chosen["a"]["at_edge"]) == (0.05, "lr=0.05, the smallest of "
                                                               "0.05..0.2")
  assert (chosen["b"]["lr"], chosen["b"]["at_edge"]) == (0.2, "lr=0.2, the largest of 0.05..0.2")
  assert (chosen["c"]["lr"], chosen["c"]["at_edge"]) == (0.1, "")
  assert selection.edge_lines(list(chosen.values()), grid) == [
      f"fedjax-rep: --select chose {chosen[n]['at_edge']} for algorithm={n}: the best may lie "
      f"outside the grid; widen it there" for n in ("a", "b")]
  assert selection.edges({"lr": 0.2}, {"lr": (0.1, 0.2)}) == []  # two values: no edge


def test_result_columns_of_new_clients_and_searches_never_name_a_setting():
  entries = [{"algorithm": "fedrep", "lr": lr, "grid": f"lr={lr}", "val_accuracy": v,
              "val_accuracy_std_over_seeds": 0.0, "test_accuracy": v,
              "test_accuracy_std_over_seeds": 0.0, "new_accuracy": v - 0.1 * lr,
              "new_accuracy_std_over_seeds": lr, "participation_gap": 0.1 * lr,
              "statistic": "last", "seeds": 2}
             for lr, v in ((0.01, 0.5), (0.1, 0.7), (0.3, 0.6))]
  assert selection.setting_keys(entries, {"lr": (0.01, 0.1, 0.3)}) == ["algorithm"]
  rows = selection.choose(entries, {"lr": (0.01, 0.1, 0.3)})
  assert [(r["algorithm"], r["lr"], r["combinations"]) for r in rows] == [("fedrep", 0.1, 3)]
