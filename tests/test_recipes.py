"""The paper's qualitative outcomes, from the recipes in --quick mode (marked slow).

fedrep-fig1, fig3 and fig4, fedavg-ft-fig1 and fig3, srpfl-linear and srpfl-speedup are
checked where their quick runs are made, in the notebooks' Checks cells
(notebooks/01_fedrep_linear, 02_fedavg_ft and 04_srpfl; tests/test_notebooks.py)."""

import collections
import re

import numpy as np
import pytest

import fedjax_rep as fr

pytestmark = pytest.mark.slow


def final_mean(rows, value, key, final_round):
  """{(algorithm, key value): mean over seeds of `value` at the final round}."""
  groups = collections.defaultdict(list)
  for row in rows:
    if row["round"] == final_round and value in row:
      groups[row["algorithm"], row[key]].append(row[value])
  return {k: float(np.mean(v)) for k, v in groups.items()}


def test_flute_fig3_cell_quick():
  """One cell of flute-fig3 (k=6, M=15): FLUTE beats FedRep(RI) at N=12 (not at N=20)."""
  rows, config = fr.run_recipe("flute-fig3", quick=True, progress=False, overrides=[
      "rep_dim=6", "num_clients=15"])
  error = final_mean(rows, "model_error", "samples_per_client", config.rounds)
  assert error["flute", 12] < error["fedrep-ri", 12] - 0.5
  floor = final_mean(rows, "rank_k_error", "samples_per_client", config.rounds)
  assert all(error[key] > floor[key] for key in error)  # nobody beats the rank-k floor
  assert not any(r["diverged_round"] for r in rows)


def test_flute_fig4_quick_flags_divergence(capsys):
  rows, config = fr.run_recipe("flute-fig4", quick=True, progress=False,
                               overrides=["loss=mean"])
  # One line on stderr per diverged run, naming its setting and round.
  runs = {(r["seed"], r["gamma1"], r["samples_per_client"]): r["diverged_round"] for r in rows}
  lines = capsys.readouterr().err.splitlines()
  assert len(lines) == len(runs) and all(re.fullmatch(
      r"fedjax-rep: flute seed \d+ \(rep_dim=\d+, num_clients=\d+, samples_per_client=\d+, "
      r"gamma1=[\d.]+\) diverged at round \d+; its metrics are NaN from then on", line)
      for line in lines)
  assert {r["gamma1"] for r in rows} == {r * config.gamma2 for r in config.gamma1_ratios}
  assert len(rows) == 5 * len(config.gamma1_ratios) * len(config.samples_per_client) * 300
  for r in rows:  # the 1/N loss diverges at eta = 0.03; every run is flagged, none crashes
    assert 0 < r["diverged_round"] <= 50
    assert (r["round"] >= r["diverged_round"]) == np.isnan(r["model_error"])


def test_digits_personalized_quick():
  """FedRep beats FedAvg and local only; fine-tuning FedAvg's head improves on FedAvg."""
  rows, config = fr.run_recipe("digits-personalized", quick=True, progress=False,
                               overrides=["algorithms=fedrep,fedavg,fedavg-ft,local"])
  from fedjax_rep.recipes.kit import summaries
  accuracy = {r["algorithm"]: r["test_accuracy"]
              for r in summaries.summary(rows, config.algorithms)}
  assert accuracy["fedrep"] > accuracy["fedavg"] + 0.1
  assert accuracy["fedrep"] >= accuracy["local"]
  assert accuracy["fedavg-ft"] > accuracy["fedavg"] + 0.1
  evaluated = [r for r in rows if r.get("test_accuracy") is not None]
  assert {r["round"] for r in evaluated} == set(range(5, config.rounds + 1, 5))
  assert all(0 <= r["test_accuracy"] <= 1 and r["test_accuracy_std"] >= 0 for r in evaluated)
