"""benchmarks/search.py: its client-epochs count the rounds each (setting, seed) computed
(a stopped setting's NaN rounds not, a diverged run's yes) x cohort x epochs per round, its
check passes within max(1 point, the seed spread), and a tiny run of its main writes both
variants, a choice per algorithm, no compiling in the timed runs and fewer client-epochs
for halving than for the grid."""

import json
import types

import pytest

from conftest import benchmark_module


@pytest.fixture(scope="module")
def search():
  return benchmark_module("search")


def test_client_epochs_count_the_rounds_computed(search):
  rows = [{"algorithm": "fedrep", "train_loss": "0.5", "diverged": "0"},
          {"algorithm": "fedrep", "train_loss": "nan", "diverged": "nan"},  # stopped
          {"algorithm": "fedrep", "train_loss": "nan", "diverged": "1"},  # diverged
          {"algorithm": "fedavg", "train_loss": "1.5", "diverged": "0"},
          {"algorithm": "fedavg", "train_loss": "", "diverged": ""}]
  assert search.computed_rounds(rows) == {"fedrep": 2, "fedavg": 1}
  conf = types.SimpleNamespace(num_clients=50, participation=0.1, head_epochs=10,
                               local_epochs=1)
  epochs = search.client_epochs(rows, conf)
  assert epochs["fedrep"] == {"rounds": 2, "cohort": 5, "epochs_per_round": 11,
                              "client_epochs": 110}
  assert epochs["fedavg"]["client_epochs"] == 5


def test_the_check_allows_a_point_or_the_seed_spread(search):
  grid = {"test_accuracy": 0.80, "test_accuracy_std_over_seeds": 0.002}
  near = {"test_accuracy": 0.795, "test_accuracy_std_over_seeds": 0.001}
  assert search.check(grid, near)["outcome"] == "PASS"
  below = {"test_accuracy": 0.78, "test_accuracy_std_over_seeds": 0.001}
  assert search.check(grid, below)["outcome"] == "FAIL"
  spread = {"test_accuracy": 0.78, "test_accuracy_std_over_seeds": 0.03}
  assert search.check(grid, spread) == pytest.approx(
      {"difference": -0.02, "tolerance": 0.03, "outcome": "PASS"})
  above = {"test_accuracy": 0.85, "test_accuracy_std_over_seeds": 0.0}
  assert search.check(grid, above)["outcome"] == "PASS (above)"


@pytest.mark.slow
def test_a_tiny_run_writes_both_variants(search, tmp_path, capsys):
  path = tmp_path / "search.json"
  search.main(["--clients", "10", "--rounds", "2", "--eval-every", "1", "--seeds", "1",
               "--confirm-seeds", "1", "--eta", "2", "--lr", "0.03", "0.1", "--momentum",
               "0.9", "--weight-decay", "0", "--json", str(path)])
  result = json.loads(path.read_text())
  assert "check fedrep:" in capsys.readouterr().out
  assert set(result["variants"]) == {"grid", "halving"}
  assert result["halving_rungs"] == [[2, 1], [1, 2]]
  for variant in result["variants"].values():
    assert variant["seconds"] > 0 and variant["compiles"] == 0
    assert set(variant["choices"]) == {"fedrep", "fedavg"}
    for choice in variant["choices"].values():
      assert choice["lr"] in (0.03, 0.1) and choice["momentum"] == 0.9
      assert 0 <= choice["confirmed"]["test_accuracy"] <= 1
      assert choice["confirmed"]["seeds"] == 1 and choice["confirmed"]["first_seed"] == 1
  grid, halving = result["variants"]["grid"], result["variants"]["halving"]
  # The grid: 2 settings x 1 seed x 2 rounds x a cohort of 1 x 11 (fedrep) or 1 epochs.
  assert grid["client_epochs"] == {"fedrep": 44, "fedavg": 4}
  assert halving["client_epochs_total"] < grid["client_epochs_total"]
  assert halving["search_rungs"] == [[0, 2, 1], [1, 1, 2]]
  assert result["ratios"]["client_epochs"] == pytest.approx(
      halving["client_epochs_total"] / grid["client_epochs_total"])
  assert set(result["checks"]) == {"fedrep", "fedavg"}
  assert all(c["outcome"] in ("PASS", "PASS (above)", "FAIL")
             for c in result["checks"].values())
  assert len(result["load_start"]) == 3 and result["machine"]
