"""Searches that stop bad settings early (experiments/search.py, sampling.py): the halving
and Hyperband schedules, candidates drawn from ranges, rungs ranked on validation only,
survivors continued from their own state, one program per rung size, search.csv,
selection.csv and search.png, resumed byte-identical, bad input refused before any work."""

import csv
import dataclasses
import json
import os
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_rep import cli
from fedjax_rep.core import checkpoint
from fedjax_rep.experiments import batch as batch_lib
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import runner
from fedjax_rep.experiments import sampling
from fedjax_rep.experiments import search as search_lib
from fedjax_rep.recipes.kit import neural

SMALL = ["num_clients=10", "rounds=9", "eval_every=1", "algorithms=fedrep",
         "validation_fraction=0.2"]
SAMPLE = ["lr=loguniform:0.003:0.3", "momentum=uniform:0:0.9"]


def read(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def test_the_halving_schedule_keeps_a_third_and_ends_at_evaluations():
  assert search_lib.halving(27, 270, 10, 3, 10) == [(27, 10), (9, 30), (3, 90), (1, 270)]
  assert search_lib.halving(27, 40, 5, 3, 5) == [(27, 10), (9, 40)]  # rounds limit it
  assert search_lib.halving(9, 9, 1, 3, 1) == [(9, 1), (3, 3), (1, 9)]
  assert search_lib.halving(9, 9, 1, 3, 2) == [(9, 3), (3, 9)]  # min_rounds limits it
  assert search_lib.halving(5, 100, 10, 3, 10) == [(5, 30), (1, 100)]


def test_hyperband_runs_brackets_from_many_short_to_few_long():
  searching = search_lib.Search("hyperband", eta=3, seed=0)
  brackets = searching.brackets(27, 27, 1)
  assert [rungs for _, rungs in brackets] == [
      [(27, 1), (9, 3), (3, 9), (1, 27)], [(12, 3), (4, 9), (1, 27)],  # s = 3, 2
      [(6, 9), (2, 27)], [(4, 27)]]  # s = 1, 0
  assert [len(c) for c, _ in brackets] == [27, 12, 6, 4]
  assert all(len(set(c)) == len(c) and max(c) < 27 for c, _ in brackets)
  assert brackets == search_lib.Search("hyperband", seed=0).brackets(27, 27, 1)
  assert brackets != search_lib.Search("hyperband", seed=1).brackets(27, 27, 1)


def test_sampled_candidates_are_a_seeded_sobol_design_inside_their_ranges():
  config = neural.Training()
  distributions = dict(sampling.parse(config, item) for item in
                       [*SAMPLE, "weight_decay=choice:0,0.0001"])
  points = sampling.draw(distributions, 27, seed=0)
  assert len(points) == 27 and points == sampling.draw(distributions, 27, seed=0)
  assert points != sampling.draw(distributions, 27, seed=1)
  lrs = np.array([p["lr"] for p in points])
  assert lrs.min() >= 0.003 and lrs.max() <= 0.3
  assert all(0 <= p["momentum"] <= 0.9 and p["weight_decay"] in (0.0, 1e-4) for p in points)
  # quasi-random: every third of log(lr)'s range holds a share of the points near a third
  thirds = np.floor(3 * np.log(lrs / 0.003) / np.log(100)).clip(0, 2)
  assert sorted(np.bincount(thirds.astype(int)).tolist()) == [9, 9, 9]


@dataclasses.dataclass(frozen=True)
class Climb:
  """A toy algorithm: w grows by hparams['step'] each round; validation rewards a large
  w, test a small one, so that their rankings disagree."""
  name: str = "climb"
  quick_compile: ClassVar[bool] = False
  tracked_metric: ClassVar[None] = None

  def init(self, key, data, hparams):
    return {"w": jnp.zeros(())}

  def round(self, state, key, data, hparams):
    w = state["w"] + hparams["step"]
    return {"w": w}, {"train_loss": -w}

  def evaluate(self, state, data, hparams):
    return {"val_accuracy": state["w"], "test_accuracy": -state["w"]}


def climb(steps, rounds=9, method="halving"):
  searching = search_lib.Search(method, eta=3)
  batch = batch_lib.Batch(progress=False, search=searching)
  data = {"x": np.zeros((2, 1), np.float32)}
  members = [[{"algorithm": "climb", "seed": s, "step": step} for s in (0, 1)]
             for step in steps]
  results = batch.train("climb", Climb(), data, [{"step": np.float32(s)} for s in steps],
                        neural.run_keys([0, 1]), rounds, members=members, eval_every=1,
                        searched=True)
  return results, searching.records


def test_a_rung_keeps_the_validation_best_and_drops_the_test_best():
  steps = [0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6]
  results, records = climb(steps)
  first = [r for r in records if r["rung"] == 0]
  kept = {r["step"] for r in first if r["outcome"] == "continued"}
  assert kept == {0.9, 0.8, 0.7}  # the largest w: the best validation
  test_best = min(steps)  # the best test accuracy at every round
  assert [r["outcome"] for r in first if r["step"] == test_best] == ["stopped"]
  assert "test_accuracy" not in records[0]
  final = [r for r in records if r["outcome"] == "final"]
  assert [r["step"] for r in final] == [0.9] and final[0]["rounds"] == 9
  dropped = results[steps.index(test_best)]
  assert np.isfinite(dropped["metrics"]["train_loss"][:, :1]).all()
  assert np.isnan(dropped["metrics"]["train_loss"][:, 1:]).all()
  assert np.isnan(dropped["eval"]["test_accuracy"][:, 1:]).all()
  # the survivor continued from its own state: w = step * round at every round
  survivor = results[steps.index(0.9)]
  np.testing.assert_allclose(survivor["eval"]["val_accuracy"],
                             np.tile(0.9 * np.arange(1, 10), (2, 1)), rtol=1e-6)
  assert survivor["eval"]["val_accuracy"].dtype == np.float32
  np.testing.assert_array_equal(survivor["eval_rounds"], np.arange(1, 10))


def test_hyperband_returns_each_candidate_at_its_furthest_rung():
  steps = [0.1 * (i + 1) for i in range(9)]
  results, records = climb(steps, rounds=9, method="hyperband")
  assert {r.get("bracket") for r in records} == {0, 1, 2}
  best = results[8]  # the largest step wins every bracket it is in
  assert np.isfinite(best["metrics"]["train_loss"]).all()
  assert {r["step"] for r in records if r["outcome"] == "final"} >= {steps[8]}


def run_search(tmp_path, name="out", overrides=SMALL, **keywords):
  out = str(tmp_path / name)
  runner.run_to_dir("digits-personalized", quick=True, seeds=2, overrides=overrides, out=out,
                    progress=False, sample=SAMPLE, trials=9, search="halving",
                    **{"checkpoint_rounds": None, **keywords})
  return out


def test_a_search_writes_search_csv_selection_and_figure_one_program_per_rung_size(
    tmp_path, compiles):
  # 12 clients: programs no other test compiles (the suite shares one compilation cache)
  out = run_search(tmp_path, overrides=["num_clients=12", *SMALL[1:]])
  loops = [n for n in compiles.names if n == "jit(_run_chunk)"]
  records = read(os.path.join(out, "search.csv"))
  sizes = {r["settings"] for r in records}
  assert sizes == {"9", "3", "1"} and len(loops) == len(sizes), compiles.names
  assert [(r["rung"], r["rounds"]) for r in records if r["outcome"] == "final"] == [("2", "9")]
  assert sum(r["outcome"] == "continued" for r in records) == 3 + 1
  chosen = read(os.path.join(out, "selection.csv"))
  final = next(r for r in records if r["outcome"] == "final")
  assert [(c["grid"], c["rung"], c["rung_rounds"]) for c in chosen] == [
      (final["grid"], "2", "9")]
  assert chosen[0]["combinations"] == "9"
  saved = json.load(open(os.path.join(out, "config.json")))
  assert saved["search"] == {"method": "halving", "eta": 3, "min_rounds": None}
  assert saved["sample"]["trials"] == 9 and len(saved["sample"]["points"]) == 9
  assert os.path.getsize(os.path.join(out, "search.png")) > 0
  assert os.path.exists(os.path.join(out, "selection.png"))


def test_a_survivor_has_the_numbers_of_its_setting_run_alone(tmp_path):
  out = run_search(tmp_path)
  chosen = read(os.path.join(out, "selection.csv"))[0]
  rows = [r for r in read(os.path.join(out, "metrics.csv")) if r["grid"] == chosen["grid"]]
  alone, _ = runner.run("digits-personalized", quick=True, seeds=2, progress=False,
                        overrides=[*SMALL, f"lr={chosen['lr']}",
                                   f"momentum={chosen['momentum']}"])
  assert len(rows) == len(alone) == 2 * 9
  by_round = {(int(r["seed"]), int(r["round"])): r for r in rows}
  for row in alone:
    searched = by_round[(row["seed"], row["round"])]
    for key in ("train_loss", "test_accuracy", "val_accuracy"):
      np.testing.assert_allclose(float(searched[key]), row[key], rtol=2e-5, atol=1e-6,
                                 err_msg=f"{key} round {row['round']}")


@pytest.mark.slow  # the fast tier keeps the toy rungs and the CLI's files
def test_a_search_killed_in_a_rung_resumes_to_the_same_files(tmp_path):
  whole = run_search(tmp_path, "whole")
  chunks = iter([None] * 4 + ["SIGTERM"])  # rungs 0 and 1 (1 + 2 rounds), then in rung 2
  with pytest.raises(checkpoint.Interrupted):
    run_search(tmp_path, "killed", stop=lambda: next(chunks))
  parts = os.listdir(tmp_path / "killed" / "parts")
  assert {p for p in parts if p.endswith(".npz") and "rung" in p} == {
      "fedrep-rung0.npz", "fedrep-rung1.npz"}
  assert cli.main(["run", "--resume", str(tmp_path / "killed"), "--no-progress"]) == 0
  for name in ("search.csv", "selection.csv", "metrics.csv"):
    with open(os.path.join(whole, name), "rb") as a, open(
        tmp_path / "killed" / name, "rb") as b:
      assert a.read() == b.read(), name


@pytest.mark.slow  # the issue's command: 27 candidates, the quick recipe's 40 rounds
def test_the_issues_search_of_27_sampled_candidates(tmp_path, capsys):
  out = str(tmp_path / "run")
  assert cli.main(["run", "digits-personalized", "--quick", "--set",
                   "validation_fraction=0.2", "--sample", SAMPLE[0], "--sample", SAMPLE[1],
                   "--trials", "27", "--search", "halving", "--seeds", "2", "--out", out,
                   "--no-progress"]) == 0
  records = read(os.path.join(out, "search.csv"))
  algorithms = neural.DEFAULT_ALGORITHMS
  assert len(records) == len(algorithms) * (27 + 9)
  assert {r["algorithm"] for r in records if r["outcome"] == "final"} == set(algorithms)
  assert len(read(os.path.join(out, "selection.csv"))) == len(algorithms)
  assert "search.csv" in capsys.readouterr().out


def test_the_table1_recipes_search_each_setting_apart(tmp_path):
  out = str(tmp_path / "t")
  runner.run_to_dir("flute-table1", quick=True, seeds=1, progress=False, out=out,
                    overrides=["rounds=3", "eval_every=1", "algorithms=fedrep",
                               "validation_fraction=0.2"],
                    grid=["lr=0.01,0.03,0.1"], search="halving")
  records = read(os.path.join(out, "search.csv"))
  settings = {(r["num_clients"], r["classes_per_client"]) for r in records}
  assert settings == {("20", "2"), ("20", "5")}
  for setting in settings:
    mine = [r for r in records if (r["num_clients"], r["classes_per_client"]) == setting]
    assert [r["outcome"] for r in mine].count("final") == 1
  assert len(read(os.path.join(out, "selection.csv"))) == 2


@pytest.mark.parametrize("extra, words", [
    (dict(search="halving", overrides=SMALL[:-1]), "validation_fraction is 0"),
    (dict(sample=["local_epochs=int:1:3"]), "give local_epochs in --grid"),
    (dict(sample=["lr=loguniform:0:0.1"]), "needs 0 < LOW"),
    (dict(sample=["lr=normal:0:1"]), "'normal' is not a distribution"),
    (dict(sample=["momentum=uniform:0:1.5"]), "momentum=1.5 is out of range"),
    (dict(sample=SAMPLE[:1], trials=None), "give --trials"),
    (dict(sample=(), trials=9, grid=["lr=0.1,0.2,0.3"]), "give --sample KEY=DIST too"),
    (dict(eta=1), "--eta must be an integer >= 2"),
    (dict(min_rounds=9), "leave one rung"),
    (dict(search="greedy"), "--search must be one of halving, hyperband"),
])
def test_bad_search_input_is_one_line_before_any_work(tmp_path, extra, words, compiles):
  keywords = {"overrides": SMALL, "sample": SAMPLE, "trials": 9, "search": "halving",
              **extra}
  with pytest.raises(cfg.ConfigError, match=words.replace("(", r"\(").replace("+", r"\+")):
    runner.run_to_dir("digits-personalized", quick=True, out=str(tmp_path / "o"),
                      progress=False, **keywords)
  assert compiles.count == 0 and not os.path.exists(tmp_path / "o")


def test_a_search_on_a_recipe_without_searchable_grids_is_refused(tmp_path):
  with pytest.raises(cfg.ConfigError, match="--search runs on the recipes"):
    runner.run_to_dir("fedrep-fig5", quick=True, out=str(tmp_path / "o"), progress=False,
                      overrides=["validation_fraction=0.2"], grid=["lr=0.01,0.1,0.3"],
                      search="halving")
