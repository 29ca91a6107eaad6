"""User-level DP in the neural recipes: dp_epsilon calibrates the noise with the accountant
and every evaluated round reports the ε spent so far, a grid of noise multipliers is one
program, config.json records the mechanism, bad input is one line before any work, and a
run without DP never imports dp-accounting."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import runner
from fedjax_rep.privacy import accountant

SMALL = ["rounds=4", "eval_every=2", "num_clients=20"]


def read(path):
  import csv
  with open(path) as f:
    return list(csv.DictReader(f))


def test_dp_epsilon_calibrates_the_noise_and_each_evaluation_reports_the_epsilon_spent(
    tmp_path):
  out = str(tmp_path / "dp")
  runner.run_to_dir("digits-personalized", quick=True, seeds=1, out=out, progress=False,
                    overrides=[*SMALL, "algorithms=fedrep,fedavg", "dp_epsilon=1"])
  rows = [r for r in read(os.path.join(out, "metrics.csv")) if r["dp_epsilon"]]
  assert {int(r["round"]) for r in rows} == {2, 4}
  delta = accountant.default_delta(20)
  record = json.load(open(os.path.join(out, "config.json")))["privacy"]
  assert record["calibrated"] and record["clip"] == 1.0 and record["delta"] == delta
  noise = record["noise_multiplier"]
  cohort = cohort_size(20, 0.1)
  for r in rows:
    expected = accountant.epsilon(noise, 20, cohort, int(r["round"]), delta)
    np.testing.assert_allclose(float(r["dp_epsilon"]), expected, rtol=1e-6)  # as written
  final = [float(r["dp_epsilon"]) for r in rows if r["round"] == "4"]
  assert all(0.99 <= e <= 1.0 for e in final)
  summary = read(os.path.join(out, "summary.csv"))
  assert [float(e["dp_epsilon"]) for e in summary] == pytest.approx([final[0]] * 2)
  assert 0.99 <= record["epsilon"] <= 1.0


def test_a_grid_of_noise_multipliers_is_one_program(compiles):
  rows, _ = runner.run("digits-personalized", quick=True, seeds=1, progress=False,
                       overrides=["rounds=2", "eval_every=2", "num_clients=16",
                                  "algorithms=fedrep", "dp_clip=0.5"],
                       grid={"dp_noise": (0.5, 1.0, 2.0)})
  assert [n for n in compiles.names if n == "jit(_run_chunk)"] == ["jit(_run_chunk)"]
  spent = {r["dp_noise"]: r["dp_epsilon"] for r in rows if r.get("dp_epsilon") is not None}
  assert spent[0.5] > spent[1.0] > spent[2.0]
  finals = {r["dp_noise"]: r["test_accuracy"] for r in rows if r["round"] == 2}
  assert len(set(finals.values())) == 3  # the noise reached the program


@pytest.mark.parametrize("overrides, words", [
    (["dp_epsilon=0"], "dp_epsilon=0.0 is out of range"),
    (["dp_epsilon=-1"], "dp_epsilon=-1.0 is out of range"),
    (["dp_epsilon=1", "dp_delta=1.5"], "dp_delta=1.5 is out of range"),
    (["dp_epsilon=1", "dp_delta=0"], "dp_delta=0.0 is out of range"),
    (["dp_clip=0", "dp_noise=1"], "dp_clip"),
    (["dp_epsilon=1", "algorithms=fedrep,scaffold"], "scaffold cannot run under user-level DP"),
    (["dp_epsilon=1", "algorithms=flute"], "flute cannot run under user-level DP"),
    (["dp_epsilon=1", "dp_noise=1"], "not both"),
    (["dp_delta=0.001"], "dp_delta is the δ of user-level DP"),
    (["dp_epsilon=1", "starting_heads=averaged"], "starting_heads=averaged"),
])
def test_bad_privacy_input_is_one_line_before_any_work(overrides, words, compiles):
  with pytest.raises(cfg.ConfigError, match=words) as error:
    runner.run("digits-personalized", quick=True, seeds=1, progress=False,
               overrides=[*SMALL, *overrides])
  assert "\n" not in str(error.value) and compiles.count == 0


def test_a_run_without_dp_never_imports_dp_accounting():
  code = ("import sys; from fedjax_rep.experiments import runner; "
          "runner.run('digits-personalized', quick=True, seeds=1, progress=False, "
          "overrides=['rounds=1', 'eval_every=1', 'num_clients=10', 'algorithms=fedrep']); "
          "print('dp_accounting' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, timeout=300)
  assert out.stdout.strip().splitlines()[-1] == "False"


def test_a_recipe_that_does_not_run_dp_refuses_it():
  with pytest.raises(cfg.ConfigError, match="srpfl-neural does not run user-level DP"):
    runner.run("srpfl-neural", quick=True, seeds=1, progress=False,
               overrides=["dp_epsilon=1"])


def test_poisson_sampling_is_accounted_by_pld_and_recorded(tmp_path):
  out = str(tmp_path / "poisson")
  runner.run_to_dir("digits-personalized", quick=True, seeds=1, out=out, progress=False,
                    overrides=[*SMALL, "algorithms=fedrep", "dp_epsilon=2",
                               "dp_sampling=poisson"])
  record = json.load(open(os.path.join(out, "config.json")))["privacy"]
  assert record["accountant"].startswith("pld") and "Poisson" in record["sampling"]
  cohort = cohort_size(20, 0.1)
  expected = accountant.epsilon(record["noise_multiplier"], 20, cohort, 4,
                                accountant.default_delta(20), sampling="poisson")
  assert record["epsilon"] == pytest.approx(expected, rel=1e-9)
  assert 1.98 <= record["epsilon"] <= 2.0


@pytest.mark.parametrize("overrides, words", [
    (["dp_epsilon=1", "dp_accountant=pld"], "pld"),
    (["dp_epsilon=1", "dp_sampling=poisson", "dp_accountant=rdp"], "rdp"),
    (["dp_sampling=poisson"], "dp_sampling is the sampling of user-level DP"),
])
def test_an_accountant_that_cannot_account_the_sampling_is_refused(overrides, words, compiles):
  with pytest.raises(cfg.ConfigError, match=words) as error:
    runner.run("digits-personalized", quick=True, seeds=1, progress=False,
               overrides=[*SMALL, *overrides])
  assert "\n" not in str(error.value) and compiles.count == 0
