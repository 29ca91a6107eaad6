"""centaur-tradeoff: CENTAUR (FedRep under user-level DP), DP-FedAvg-FT and local only at
each ε; every ε of both private methods is one compiled program, each calibrates a noise whose ε is
within 1 % of it (PLD at full participation), local only trains without DP, and the
recipe's own DP keys refuse bad input in one line before any work."""

import json
import os

import pytest

from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import runner
from fedjax_rep.privacy import accountant

SMALL = ["rounds=4", "eval_every=2", "num_clients=40", "epsilons=0.5,4"]


def read(path):
  import csv
  with open(path) as f:
    return list(csv.DictReader(f))


def test_each_method_runs_every_epsilon_in_one_program_and_spends_it(tmp_path, compiles):
  out = str(tmp_path / "tradeoff")
  runner.run_to_dir("centaur-tradeoff", quick=True, seeds=1, out=out, progress=False,
                    overrides=SMALL)
  # CENTAUR and DP-FedAvg-FT at every ε run the family program (`nn.program`) with the DP
  # options: one compilation; local only, without them, the other.
  assert [n for n in compiles.names if n == "jit(_run_chunk)"] == ["jit(_run_chunk)"] * 2
  summary = read(os.path.join(out, "summary.csv"))
  assert [(r["algorithm"], float(r["target_epsilon"])) for r in summary] == [
      (m, e) for e in (0.5, 4.0) for m in ("centaur", "dp-fedavg-ft", "local")]
  for r in summary:
    if r["algorithm"] == "local":
      assert r["dp_epsilon"] == ""  # trained without DP: spends nothing
    else:
      assert 0.99 * float(r["target_epsilon"]) <= float(r["dp_epsilon"]) <= float(
          r["target_epsilon"])
  local = [float(r["test_accuracy"]) for r in summary if r["algorithm"] == "local"]
  assert local[0] == local[1]  # one run drawn at every ε
  record = json.load(open(os.path.join(out, "config.json")))["privacy"]
  assert set(record) == {"centaur", "dp-fedavg-ft"}
  centaur = record["centaur"]
  assert centaur["ε=0.5"]["accountant"].startswith("pld")
  assert centaur["ε=0.5"]["clip"] == 0.1 and record["dp-fedavg-ft"]["ε=4"]["clip"] == 0.2
  assert centaur["ε=0.5"]["noise_multiplier"] > centaur["ε=4"]["noise_multiplier"]
  noise = centaur["ε=4"]["noise_multiplier"]
  assert accountant.epsilon(noise, 40, 40, 4, 1e-5) == pytest.approx(
      centaur["ε=4"]["epsilon"], rel=1e-9)
  assert os.path.exists(os.path.join(out, "centaur-tradeoff.png"))


@pytest.mark.parametrize("overrides, words", [
    (["dp_epsilon=1"], "centaur-tradeoff sets dp_epsilon itself"),
    (["dp_clip=0.1"], "centaur-tradeoff sets dp_clip itself"),
    (["epsilons=0.5,0"], "epsilons"),
    (["centaur_clip=0"], "centaur_clip"),
    (["dp_delta=1"], "dp_delta=1.0 is out of range"),
    (["dp_sampling=poisson"], "poisson"),
])
def test_bad_input_is_one_line_before_any_work(overrides, words, compiles):
  with pytest.raises(cfg.ConfigError, match=words) as error:
    runner.run("centaur-tradeoff", quick=True, seeds=1, progress=False,
               overrides=[*SMALL, *overrides])
  assert "\n" not in str(error.value) and compiles.count == 0
