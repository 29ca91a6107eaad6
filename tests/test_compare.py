"""`fedjax-rep compare`: the keys that differ between run directories, their summaries side
by side, the figure's curves, the errors; on run directories written here and on two real
quick runs."""

import csv
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from fedjax_rep import cli
from fedjax_rep.experiments import compare
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import plotting

ROOT = pathlib.Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


def write_csv(path, rows):
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def metrics(lr, algorithms=("fedrep", "fedavg"), seeds=(0, 1), rounds=4, grid=None):
  """metrics.csv rows: train_loss every round, test_accuracy every other round (empty cells
  between), a value of lr + algorithm index + seed / 10 + round / 100 for accuracy."""
  rows = []
  for a, name in enumerate(algorithms):
    for seed in seeds:
      for t in range(1, rounds + 1):
        accuracy = lr + a + seed / 10 + t / 100
        rows.append({"algorithm": name, "seed": seed, "round": t,
                     **({"lr": lr, "grid": f"lr={lr}"} if grid else {}),
                     "diverged_round": 0, "diverged": 0, "train_loss": 1 / t,
                     "test_accuracy": f"{accuracy:.6g}" if t % 2 == 0 else ""})
  return rows


def make_run(path, *, lr=0.05, seeds=2, options=(), grid=None, extra=None, summary=True,
             rows=None, summary_name="summary.csv"):
  """A run directory of digits-personalized as `fedjax-rep run` writes it (config.json,
  metrics.csv, its summary table, .complete); returns its path as a string."""
  os.makedirs(path)
  config = {"lr": lr, "momentum": 0.5, "num_clients": 50, "algorithms": ["fedrep", "fedavg"],
            "options": [list(option) for option in options], "rounds": 4, **(extra or {})}
  saved = {"recipe": "digits-personalized", "quick": True, "seeds": seeds, "config": config,
           "grid": grid or {}, "code": {"revision": str(path)}, "versions": {}}
  (path / "config.json").write_text(json.dumps(saved))
  write_csv(path / "metrics.csv", rows or metrics(lr))
  listed = ["config.json", "metrics.csv"]
  if summary:
    write_csv(path / summary_name, [
        {"algorithm": "fedrep", "test_accuracy": f"{lr + 0.5:g}", "seeds": seeds},
        {"algorithm": "fedavg", "test_accuracy": f"{lr + 0.25:g}", "seeds": seeds}])
    listed.append(summary_name)
  (path / ".complete").write_text(json.dumps({"files": listed}))
  return str(path)


def read_csv(path):
  with open(path, newline="") as f:
    return list(csv.reader(f))


def test_flat_config_names_recipe_quick_seeds_fields_options_and_grid():
  saved = {"recipe": "r", "quick": False, "seeds": 3, "code": {"revision": "x"},
           "config": {"lr": 0.1, "algorithms": ["fedrep"], "options": [["mtl_lambda", 0.5]]},
           "grid": {"momentum": [0, 0.5]}}
  assert compare.flat_config(saved) == {
      "recipe": "r", "quick": False, "seeds": 3, "lr": 0.1, "algorithms": ["fedrep"],
      "mtl_lambda": 0.5, "grid.momentum": [0, 0.5]}


def test_differing_keys_are_those_not_equal_in_every_run_missing_counted(tmp_path):
  a = make_run(tmp_path / "a", lr=0.05, options=[("mtl_lambda", 0.1)])
  b = make_run(tmp_path / "b", lr=0.1, options=[("mtl_lambda", 0.1)])
  c = make_run(tmp_path / "c", lr=0.05, seeds=3, options=[("mtl_lambda", 0.2)],
               grid={"momentum": [0, 0.5]}, extra={"partition": "iid"})
  runs = compare.read_runs([a, b, c])
  assert compare.differing_keys(runs[:2]) == ["lr"]
  assert compare.differing_keys(runs) == ["seeds", "lr", "mtl_lambda", "partition",
                                          "grid.momentum"]
  assert compare.differing_keys([runs[0], compare.read_run(a)]) == []


def test_the_table_has_a_row_per_run_and_summary_row_under_the_differing_keys(tmp_path):
  a = make_run(tmp_path / "a", lr=0.05)
  b = make_run(tmp_path / "b", lr=0.1, seeds=3, summary_name="table1.csv")
  result = compare.compare([a, b], csv_path=str(tmp_path / "t.csv"),
                           figure_path=str(tmp_path / "f.png"))
  assert result.keys == ["seeds", "lr"] and result.metric == "test_accuracy"
  expected = [["run", "seeds", "lr", "algorithm", "test_accuracy"],
              [a, "2", "0.05", "fedrep", "0.55", ], [a, "2", "0.05", "fedavg", "0.3"],
              [b, "3", "0.1", "fedrep", "0.6"], [b, "3", "0.1", "fedavg", "0.35"]]
  assert read_csv(tmp_path / "t.csv") == expected
  assert list(csv.reader(result.table.splitlines())) == expected
  assert result.written == [str(tmp_path / "f.png"), str(tmp_path / "t.csv")]
  assert (tmp_path / "f.png").read_bytes()[:8] == PNG


def test_a_run_without_summary_gets_one_row_and_a_grid_key_shows_each_rows_value(tmp_path):
  a = make_run(tmp_path / "a", lr=0.05, summary=False)
  b = make_run(tmp_path / "b", lr=0.05, grid={"lr": [0.05, 0.1]},
               rows=metrics(0.05, grid=True) + metrics(0.1, grid=True))
  write_csv(tmp_path / "b" / "summary.csv", [
      {"algorithm": "fedrep", "lr": 0.05, "grid": "lr=0.05", "test_accuracy": 0.7},
      {"algorithm": "fedrep", "lr": 0.1, "grid": "lr=0.1", "test_accuracy": 0.8}])
  runs = compare.read_runs([a, b])
  keys = compare.differing_keys(runs)
  assert keys == ["grid.lr"]
  rows = compare.summary_rows(runs, keys)
  assert rows == [
      {"run": a, "grid.lr": ""},
      {"run": b, "grid.lr": "0.05,0.1", "algorithm": "fedrep", "lr": "0.05", "grid": "lr=0.05",
       "test_accuracy": "0.7"},
      {"run": b, "grid.lr": "0.05,0.1", "algorithm": "fedrep", "lr": "0.1", "grid": "lr=0.1",
       "test_accuracy": "0.8"}]


@pytest.fixture
def drawn(monkeypatch):
  """The figures `compare.plot` saves, as {legend label: (xs, ys) of its mean line}."""
  lines = []
  save = plotting.save

  def keep(fig, file):
    save(fig, file)
    lines.append({str(handle.get_label()): (handle.get_xdata(), handle.get_ydata())
                  for ax in fig.axes for handle in ax.lines})

  monkeypatch.setattr(plotting, "save", keep)
  return lines


def test_the_figure_draws_the_mean_over_seeds_at_the_rounds_that_have_the_metric(
    tmp_path, drawn):
  a = make_run(tmp_path / "a", lr=0.05)
  b = make_run(tmp_path / "b", lr=0.1)
  compare.compare([a, b], figure_path=str(tmp_path / "f.png"))
  (lines,) = drawn
  assert sorted(lines) == [f"{a} (lr=0.05): FedAvg", f"{a} (lr=0.05): FedRep",
                           f"{b} (lr=0.1): FedAvg", f"{b} (lr=0.1): FedRep"]
  xs, ys = lines[f"{b} (lr=0.1): FedAvg"]
  assert list(xs) == [2, 4]  # the rounds evaluated; the empty cells between are left out
  np.testing.assert_allclose(ys, [0.1 + 1 + 0.05 + 0.02, 0.1 + 1 + 0.05 + 0.04])
  compare.compare([a, b], figure_path=str(tmp_path / "g.png"), metric="train_loss")
  xs, ys = drawn[1][f"{a} (lr=0.05): FedRep"]
  assert list(xs) == [1, 2, 3, 4]
  np.testing.assert_allclose(ys, [1, 1 / 2, 1 / 3, 1 / 4])


def test_nan_cells_of_a_diverged_run_are_left_out_and_said_in_the_legend(tmp_path, drawn):
  rows = metrics(0.1)
  for row in rows:
    if row["algorithm"] == "fedrep" and row["seed"] == 1:
      row["diverged_round"] = 3
      if row["round"] >= 3:
        row.update(diverged=1, train_loss="nan", test_accuracy="nan")
  a = make_run(tmp_path / "a", lr=0.05)
  b = make_run(tmp_path / "b", lr=0.1, rows=rows)
  compare.compare([a, b], figure_path=str(tmp_path / "f.png"))
  xs, ys = drawn[0][f"{b} (lr=0.1): FedRep (diverged at x: 1/2 seeds)"]
  assert list(xs) == [2, 4]  # the mean over the seed that did not diverge
  np.testing.assert_allclose(ys, [0.1 + 0.02, 0.1 + 0.04])
  assert (tmp_path / "f.png").read_bytes()[:8] == PNG


def test_grid_labels_and_settings_make_lines_of_their_own(tmp_path, drawn):
  a = make_run(tmp_path / "a", lr=0.05)
  rows = [{**row, "num_clients": n} for n, lr in ((10, 0.06), (100, 0.15))
          for row in metrics(lr, grid=True)]
  b = make_run(tmp_path / "b", lr=0.05, grid={"lr": [0.06, 0.15]}, rows=rows)
  compare.compare([a, b], figure_path=str(tmp_path / "f.png"), metric="test_accuracy")
  (lines,) = drawn
  assert sorted(lines) == sorted(
      [f"{a} (grid.lr=-): FedRep", f"{a} (grid.lr=-): FedAvg"]
      + [f"{b} (grid.lr=0.06,0.15): {name}, num_clients={n} (lr={lr})"
         for name in ("FedRep", "FedAvg") for n, lr in ((10, 0.06), (100, 0.15))])
  np.testing.assert_allclose(lines[f"{b} (grid.lr=0.06,0.15): FedRep, num_clients=10 "
                                   f"(lr=0.06)"][1], [0.06 + 0.05 + 0.02, 0.06 + 0.05 + 0.04])


LRS = (0.03, 0.1, 0.3)  # the grid of `grid_run`


def grid_run(path, *, chosen=None, val=None, momentum=0.5):
  """A run directory of a grid lr=0.03,0.1,0.3 of fedrep and fedavg (`metrics` of each lr):
  a summary.csv row per algorithm and lr (test_accuracy, an upload_bytes cost column and,
  where `val` ({algorithm: a value per lr}) is given, val_accuracy) and, where `chosen`
  ({algorithm: lr}) is given, a selection.csv of those choices; returns its path."""
  path = pathlib.Path(make_run(path, grid={"lr": list(LRS)}, summary=False,
                               extra={"momentum": momentum},
                               rows=[row for lr in LRS for row in metrics(lr, grid=True)]))
  write_csv(path / "summary.csv", [
      {"algorithm": name, "lr": lr, "grid": f"lr={lr}", "test_accuracy": lr + a,
       **({"val_accuracy": val[name][i]} if val else {}), "seeds": 2, "upload_bytes": 1000}
      for a, name in enumerate(("fedrep", "fedavg")) for i, lr in enumerate(LRS)])
  listed = ["config.json", "metrics.csv", "summary.csv"]
  if chosen:
    write_csv(path / "selection.csv", [
        {"algorithm": name, "lr": lr, "grid": f"lr={lr}", "val_accuracy": 0.9,
         "test_accuracy": lr, "combinations": 3} for name, lr in chosen.items()])
    listed.append("selection.csv")
  (path / ".complete").write_text(json.dumps({"files": listed}))
  return str(path)


@pytest.fixture
def panels(monkeypatch):
  """The figures `compare.plot` saves, as {panel title: [its lines' legend labels]}."""
  figures = []
  save = plotting.save

  def keep(fig, file):
    figures.append({ax.get_title(): [str(line.get_label()) for line in ax.lines]
                    for ax in fig.axes})
    save(fig, file)

  monkeypatch.setattr(plotting, "save", keep)
  return figures


def mean_line(lr, algorithm):
  """The mean over seeds of `metrics`' test_accuracy at rounds 2 and 4 of an algorithm."""
  a = ("fedrep", "fedavg").index(algorithm)
  return [lr + a + 0.05 + 0.02, lr + a + 0.05 + 0.04]


def test_a_grid_shows_each_algorithms_chosen_combination_a_panel_per_algorithm(
    tmp_path, drawn, panels):
  a = grid_run(tmp_path / "a", chosen={"fedrep": 0.1, "fedavg": 0.3})
  b = grid_run(tmp_path / "b", chosen={"fedrep": 0.3, "fedavg": 0.03}, momentum=0.9)
  result = compare.compare([a, b], figure_path=str(tmp_path / "f.png"),
                           csv_path=str(tmp_path / "t.csv"))
  assert panels == [{
      "FedRep": [f"{a} (momentum=0.5): FedRep (lr=0.1)", f"{b} (momentum=0.9): FedRep (lr=0.3)"],
      "FedAvg": [f"{a} (momentum=0.5): FedAvg (lr=0.3)",
                 f"{b} (momentum=0.9): FedAvg (lr=0.03)"]}]
  (lines,) = drawn
  for run, momentum, chosen in ((a, 0.5, {"FedRep": 0.1, "FedAvg": 0.3}),
                                (b, 0.9, {"FedRep": 0.3, "FedAvg": 0.03})):
    for name, lr in chosen.items():  # each line is its chosen combination's mean
      xs, ys = lines[f"{run} (momentum={momentum}): {name} (lr={lr})"]
      assert list(xs) == [2, 4]
      np.testing.assert_allclose(ys, mean_line(lr, name.lower()))
  table = list(csv.reader(result.table.splitlines()))
  assert table == [["run", "momentum", "algorithm", "lr", "grid", "test_accuracy"],
                   [a, "0.5", "fedrep", "0.1", "lr=0.1", "0.1"],
                   [a, "0.5", "fedavg", "0.3", "lr=0.3", "1.3"],
                   [b, "0.9", "fedrep", "0.3", "lr=0.3", "0.3"],
                   [b, "0.9", "fedavg", "0.03", "lr=0.03", "1.03"]]
  written = read_csv(tmp_path / "t.csv")  # the CSV file keeps every column
  assert written[0] == ["run", "momentum", "algorithm", "lr", "grid", "test_accuracy", "seeds",
                        "upload_bytes"]
  assert [row[:5] for row in written[1:]] == [row[:5] for row in table[1:]]


def test_all_combinations_draws_and_tabulates_every_combination(tmp_path, drawn, panels):
  a = grid_run(tmp_path / "a", chosen={"fedrep": 0.1, "fedavg": 0.3})
  b = grid_run(tmp_path / "b", chosen={"fedrep": 0.3, "fedavg": 0.03}, momentum=0.9)
  result = compare.compare([a, b], figure_path=str(tmp_path / "f.png"), all_combinations=True)
  (figure,) = panels
  assert list(figure) == ["FedRep", "FedAvg"]
  for name, labels in figure.items():
    assert labels == [f"{run} (momentum={m}): {name} (lr={lr})"
                      for run, m in ((a, 0.5), (b, 0.9)) for lr in LRS]
  np.testing.assert_allclose(drawn[0][f"{b} (momentum=0.9): FedAvg (lr=0.1)"][1],
                             mean_line(0.1, "fedavg"))
  table = list(csv.reader(result.table.splitlines()))
  assert [row[:4] for row in table[1:]] == [[run, m, name, str(lr)] for run, m in
                                            ((a, "0.5"), (b, "0.9"))
                                            for name in ("fedrep", "fedavg") for lr in LRS]


def test_without_selection_the_best_validation_accuracy_is_chosen(tmp_path, drawn, panels,
                                                                  capsys):
  val = {"fedrep": [0.5, "nan", 0.7], "fedavg": [0.6, 0.6, 0.2]}  # NaN never wins; ties: first
  a = grid_run(tmp_path / "a", val=val)
  b = grid_run(tmp_path / "b", momentum=0.9)  # neither selection.csv nor val_accuracy
  assert compare.choice(compare.read_run(a)) == [{"algorithm": "fedrep", "grid": "lr=0.3"},
                                                 {"algorithm": "fedavg", "grid": "lr=0.03"}]
  assert compare.choice(compare.read_run(b)) is None
  result = compare.compare([a, b], figure_path=str(tmp_path / "f.png"))
  assert capsys.readouterr().err == (
      f"fedjax-rep: {b} has a grid but no validation-based choice among its combinations (no "
      f"selection.csv, no val_accuracy in its summary): showing every one; run it with "
      f"--select to choose one per algorithm\n")
  assert panels[0]["FedRep"] == [f"{a} (momentum=0.5): FedRep (lr=0.3)",
                                 *(f"{b} (momentum=0.9): FedRep (lr={lr})" for lr in LRS)]
  np.testing.assert_allclose(drawn[0][f"{a} (momentum=0.5): FedAvg (lr=0.03)"][1],
                             mean_line(0.03, "fedavg"))
  table = list(csv.reader(result.table.splitlines()))
  assert table[0] == ["run", "momentum", "algorithm", "lr", "grid", "test_accuracy",
                      "val_accuracy"]
  assert [row[:4] for row in table[1:]] == [
      [a, "0.5", "fedrep", "0.3"], [a, "0.5", "fedavg", "0.03"],
      *([b, "0.9", name, str(lr)] for name in ("fedrep", "fedavg") for lr in LRS)]


def test_a_run_without_an_algorithm_column_is_one_panel_named_by_its_recipe(tmp_path, panels):
  a = make_run(tmp_path / "a", lr=0.05)
  rows = [{k: v for k, v in row.items() if k != "algorithm"}
          for row in metrics(0.1, algorithms=("fedrep",))]
  b = make_run(tmp_path / "b", lr=0.1, rows=rows, summary=False)
  compare.compare([a, b], figure_path=str(tmp_path / "f.png"))
  assert panels == [{"FedRep": [f"{a} (lr=0.05): FedRep"], "FedAvg": [f"{a} (lr=0.05): FedAvg"],
                     "digits-personalized": [f"{b} (lr=0.1): digits-personalized"]}]


def test_the_default_metric_is_the_first_preferred_that_every_run_has_as_a_curve(tmp_path):
  a = make_run(tmp_path / "a", lr=0.05)
  b = make_run(tmp_path / "b", lr=0.1)
  no_accuracy = [{k: v for k, v in row.items() if k != "test_accuracy"} for row in metrics(0.1)]
  c = make_run(tmp_path / "c", lr=0.1, rows=no_accuracy)
  runs = compare.read_runs([a, b, c])
  assert compare.choose_metric(runs[:2]) == "test_accuracy"
  assert compare.choose_metric(runs) == "train_loss"
  one_round = [{**row, "test_accuracy": 0.5 if row["round"] == 1 else ""}
               for row in metrics(0.2)]
  d = make_run(tmp_path / "d", lr=0.2, rows=one_round)
  assert compare.choose_metric(compare.read_runs([a, d])) == "train_loss"
  assert compare.choose_metric(compare.read_runs([a, d]), "test_accuracy") == "test_accuracy"


def test_a_metric_that_a_run_lacks_is_an_error_naming_the_metrics(tmp_path):
  a = make_run(tmp_path / "a", lr=0.05)
  no_accuracy = [{k: v for k, v in row.items() if k != "test_accuracy"} for row in metrics(0.1)]
  b = make_run(tmp_path / "b", lr=0.1, rows=no_accuracy)
  with pytest.raises(cfg.ConfigError) as error:
    compare.compare([a, b], figure_path=str(tmp_path / "f.png"), metric="test_accuracy")
  assert str(error.value) == (f"--metric test_accuracy is not a metric of {b} (its metrics: "
                              f"train_loss); metrics of every run: train_loss")
  assert not (tmp_path / "f.png").exists()


def test_every_directory_is_checked_before_any_work(tmp_path):
  good = make_run(tmp_path / "good")
  (tmp_path / "empty").mkdir()
  started = tmp_path / "started"
  started.mkdir()
  (started / "config.json").write_text("{}")
  missing = str(tmp_path / "missing")
  figure = tmp_path / "f.png"
  with pytest.raises(cfg.ConfigError) as error:
    compare.compare([good, missing, str(tmp_path / "empty"), str(started)],
                    figure_path=str(figure))
  message = str(error.value)
  assert f"{missing} does not exist" in message
  assert f"{tmp_path / 'empty'} is not a run directory (a directory without a config.json)" \
      in message
  assert (f"{started} has no metrics.csv yet (the run has not finished: finish it with "
          f"`fedjax-rep run --resume {started}`)") in message
  assert message.endswith("give the --out directories of finished `fedjax-rep run` runs, "
                          "each once")
  assert good not in message and not figure.exists()
  (tmp_path / "file").write_text("")
  with pytest.raises(cfg.ConfigError, match="file is a file, not a run directory"):
    compare.check_dirs([good, str(tmp_path / "file")])
  with pytest.raises(cfg.ConfigError, match="are one directory"):
    compare.check_dirs([good, good + "/"])
  with pytest.raises(cfg.ConfigError, match="two run directories or more, got 1"):
    compare.check_dirs([good])
  (started / "metrics.csv").write_text("algorithm,seed,round,train_loss\nfedrep,0,1,1\n")
  (started / "config.json").write_text("[1]")
  with pytest.raises(cfg.ConfigError, match="is not a run's config.json"):
    compare.read_runs([good, str(started)])


def test_cli_prints_the_table_then_what_it_wrote(tmp_path, capsys, monkeypatch):
  a = make_run(tmp_path / "a", lr=0.05)
  b = make_run(tmp_path / "b", lr=0.1)
  monkeypatch.chdir(tmp_path)
  assert cli.main(["compare", a, b, "--csv", "t.csv"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert [line.split() for line in lines[:5]] == [
      ["run", "lr", "algorithm", "test_accuracy", "seeds"], [a, "0.05", "fedrep", "0.55", "2"],
      [a, "0.05", "fedavg", "0.3", "2"], [b, "0.1", "fedrep", "0.6", "2"],
      [b, "0.1", "fedavg", "0.35", "2"]]
  assert lines[0].index("lr") == lines[1].index("0.05") == lines[3].index("0.1")  # aligned
  assert lines[5:] == ["wrote compare.png, t.csv (test_accuracy against round)"]
  assert (tmp_path / "compare.png").read_bytes()[:8] == PNG
  assert read_csv(tmp_path / "t.csv")[1] == [a, "0.05", "fedrep", "0.55", "2"]


def test_cli_all_prints_and_draws_every_combination(tmp_path, capsys, panels):
  a = grid_run(tmp_path / "a", chosen={"fedrep": 0.1, "fedavg": 0.3})
  b = grid_run(tmp_path / "b", chosen={"fedrep": 0.3, "fedavg": 0.03}, momentum=0.9)
  figure = str(tmp_path / "f.png")
  assert cli.main(["compare", a, b, "--figure", figure]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert [line.split()[:4] for line in lines[:5]] == [
      ["run", "momentum", "algorithm", "lr"], [a, "0.5", "fedrep", "0.1"],
      [a, "0.5", "fedavg", "0.3"], [b, "0.9", "fedrep", "0.3"], [b, "0.9", "fedavg", "0.03"]]
  assert lines[5:] == [f"wrote {figure} (test_accuracy against round)"]
  assert cli.main(["compare", a, b, "--figure", figure, "--all"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 1 + 12 + 1 and lines[0].split()[-1] == "test_accuracy"
  assert [len(panel) for panel in panels[1].values()] == [6, 6]
  assert [len(panel) for panel in panels[0].values()] == [2, 2]


def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys):
  a = make_run(tmp_path / "a", lr=0.05)
  assert cli.main(["compare", a]) == 2
  assert capsys.readouterr().err == ("fedjax-rep: error: compare needs two run directories or "
                                     "more, got 1: give the --out directories of "
                                     "`fedjax-rep run` runs\n")
  assert cli.main(["compare", a, str(tmp_path / "nope"), "--figure",
                   str(tmp_path / "f.png")]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"fedjax-rep: error: cannot compare: {tmp_path / 'nope'} does not "
                        f"exist;") and err.count("\n") == 1
  b = make_run(tmp_path / "b", lr=0.1)
  assert cli.main(["compare", a, b, "--metric", "nope", "--figure",
                   str(tmp_path / "f.png")]) == 2
  assert "--metric nope is not a metric of" in capsys.readouterr().err
  assert cli.main(["compare", a, b, "--figure", str(tmp_path / "no" / "f.png")]) == \
      cli.WRITE_FAILED
  assert capsys.readouterr().err.startswith(f"fedjax-rep: error: cannot write "
                                            f"{tmp_path / 'no' / 'f.png'} (")


def test_the_command_imports_no_jax(tmp_path):
  a = make_run(tmp_path / "a", lr=0.05)
  b = make_run(tmp_path / "b", lr=0.1)
  done = subprocess.run([sys.executable, "-X", "importtime", "-m", "fedjax_rep", "compare", a, b,
                         "--figure", str(tmp_path / "f.png")], capture_output=True, text=True,
                        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, check=True)
  imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
              if line.startswith("import time:")}
  assert "fedjax_rep.experiments.compare" in imported and "matplotlib" in imported
  assert {name for name in imported if name.split(".")[0] in ("jax", "jaxlib")} == set()
  assert done.stdout.splitlines()[-1].startswith(f"wrote {tmp_path / 'f.png'}")


@pytest.mark.slow  # the fast tier keeps the comparisons of written run directories
def test_two_real_quick_runs_differ_in_lr_only(tmp_path, capsys):
  common = ["--quick", "--no-progress", "--seeds", "2", "--set", "rounds=10", "--set",
            "algorithms=fedrep,fedavg"]
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  assert cli.main(["run", "digits-personalized", *common, "--out", a]) == 0
  assert cli.main(["run", "digits-personalized", *common, "--set", "lr=0.1", "--out", b]) == 0
  capsys.readouterr()
  assert cli.main(["compare", a, b, "--csv", str(tmp_path / "t.csv"), "--figure",
                   str(tmp_path / "f.png")]) == 0
  lines = capsys.readouterr().out.splitlines()
  table = read_csv(tmp_path / "t.csv")
  assert table[0][:4] == ["run", "lr", "algorithm", "test_accuracy"]
  assert lines[0].split()[:4] == table[0][:4]
  assert [row[:3] for row in table[1:]] == [[a, "0.05", "fedrep"], [a, "0.05", "fedavg"],
                                            [b, "0.1", "fedrep"], [b, "0.1", "fedavg"]]
  for run, row in zip([a, a, b, b], table[1:]):  # each run's summary, as it wrote it
    assert row[2:] in read_csv(os.path.join(run, "summary.csv"))[1:]
  assert lines[-1] == f"wrote {tmp_path / 'f.png'}, {tmp_path / 't.csv'} (test_accuracy " \
      f"against round)"
  assert (tmp_path / "f.png").read_bytes()[:8] == PNG
