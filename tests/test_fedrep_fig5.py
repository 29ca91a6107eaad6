"""fedrep-fig5 (FedRep's Fig. 5: local test error vs local epochs E): what E sets for each
algorithm, every (algorithm, E) one member of one program, the per-E summary, and the
recipe end to end in --quick."""

import csv

import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.experiments import config as cfg
from fedjax_rep.nn import models
from fedjax_rep.recipes.fedrep import fig5
from fedjax_rep.recipes.kit import neural


def rows_of(accuracies: dict, rounds: int = 12) -> list[dict]:
  """metrics.csv-like rows: accuracies[(algorithm, E, seed)] is the constant test accuracy
  of that run's evaluated rounds, except round 1 (0.0: outside the last 10)."""
  rows = []
  for (name, e, seed), accuracy in accuracies.items():
    for t in range(1, rounds + 1):
      rows.append({"algorithm": name, "seed": seed, "round": t, fig5.E_COLUMN: e,
                   "diverged_round": 0, "train_loss": 1.0,
                   "test_accuracy": 0.0 if t == 1 else accuracy})
  return rows


def test_e_sets_fedrep_s_head_epochs_and_fedavg_s_local_epochs(compiles):
  config = fr.resolve("fedrep-fig5", quick=True)
  assert fig5.epochs_field(config, "fedrep") == "head_epochs"
  assert fig5.epochs_field(config, "fedavg") == "local_epochs"
  fedrep = fig5.algorithm(config, "fedrep", 7, None, 20)
  fedavg = fig5.algorithm(config, "fedavg", 7, None, 20)
  assert (fedrep.head_epochs, fedrep.local_epochs) == (7, config.local_epochs) == (7, 1)
  assert (fedavg.head_epochs, fedavg.local_epochs) == (0, 7)
  assert compiles.count == 0


def test_every_algorithm_and_e_is_a_member_of_one_program(compiles):
  """The default's 2 x 6 settings share one traced program (one compilation), each with its
  own epochs; nothing compiles to find that out."""
  config = fr.resolve("fedrep-fig5")
  model = models.make_model("digits-mlp", 10)
  own = {m: fig5.algorithm(config, *m, model, 100) for m in fig5.members(config)}
  assert list(own) == [(n, e) for n in ("fedrep", "fedavg") for e in (1, 2, 5, 10, 15, 20)]

  class Data:  # what `shared_program` asks of the data
    def input_spec(self, runs=0):
      return np.zeros((8, 8, 1), np.float32)

  programs = {m: neural.shared_program(config, a, neural.hparams(config), list(own.values()),
                                       Data()) for m, a in own.items()}
  assert len({p for p, _ in programs.values()}) == 1
  program = programs["fedrep", 1][0]
  assert (program.head_epochs, program.local_epochs, program.traced) == (20, 20, True)
  member = lambda m: programs[m][1].member
  assert (int(member(("fedrep", 15)).head_epochs), int(member(("fedrep", 15)).local_epochs)) \
      == (15, 1)
  assert (int(member(("fedavg", 15)).head_epochs), int(member(("fedavg", 15)).local_epochs)) \
      == (0, 15)
  assert compiles.count == 0


@pytest.mark.parametrize("item,pattern", [
    ("local_epochs_E=1,5,1", "repeats a value"),
    ("algorithms=fedrep,fedrep-star", "fedrep-star trains the same whatever E"),
    ("local_epochs_E=0", "local_epochs_E"),
])
def test_bad_settings_fail_before_any_compilation(item, pattern, compiles):
  with pytest.raises(cfg.ConfigError, match=pattern):
    fr.resolve("fedrep-fig5", quick=True, overrides=[item])
  assert compiles.count == 0


def test_summary_is_the_error_per_algorithm_and_e():
  """1 - each seed's mean of its last 10 evaluations, averaged over seeds, with its std and
  the change from the previous E; E ascending whatever the configuration's order."""
  config = cfg.override(fr.resolve("fedrep-fig5", quick=True), ["local_epochs_E=5,1"])
  accuracies = {("fedrep", 1, 0): 0.6, ("fedrep", 1, 1): 0.8, ("fedrep", 5, 0): 0.9,
                ("fedrep", 5, 1): 0.9, ("fedavg", 1, 0): 0.5, ("fedavg", 1, 1): 0.5,
                ("fedavg", 5, 0): 0.4, ("fedavg", 5, 1): 0.2}
  table = fig5.summarize(rows_of(accuracies), config)
  assert [(e["algorithm"], e[fig5.E_COLUMN]) for e in table] == [
      ("fedrep", 1), ("fedrep", 5), ("fedavg", 1), ("fedavg", 5)]
  by = {(e["algorithm"], e[fig5.E_COLUMN]): e for e in table}
  assert by["fedrep", 1]["test_error"] == pytest.approx(0.3)
  assert by["fedrep", 1]["test_error_std_over_seeds"] == pytest.approx(0.1)
  assert by["fedrep", 1]["change_from_previous_E"] == ""
  assert by["fedrep", 5]["change_from_previous_E"] == pytest.approx(0.1 - 0.3)
  assert by["fedavg", 5]["test_error"] == pytest.approx(0.7)
  assert by["fedavg", 5]["change_from_previous_E"] == pytest.approx(0.2)
  assert by["fedavg", 5]["statistic"] == "mean of the last 10 evaluations"
  assert {e["seeds"] for e in table} == {2}
  points = {(p["algorithm"], p[fig5.E_COLUMN], p["seed"]): p["test_error"]
            for p in fig5.errors(rows_of(accuracies), config)}
  assert points == pytest.approx({k: 1 - v for k, v in accuracies.items()})


@pytest.mark.slow
def test_quick_run_writes_its_files(tmp_path):
  assert cli.main(["run", "fedrep-fig5", "--quick", "--no-progress", "--out",
                   str(tmp_path)]) == 0
  with open(tmp_path / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  config = fr.resolve("fedrep-fig5", quick=True)
  assert {(r["algorithm"], int(r[fig5.E_COLUMN])) for r in rows} == {
      (n, e) for n in ("fedrep", "fedavg") for e in config.local_epochs_E}
  assert len(rows) == 2 * len(config.local_epochs_E) * 3 * config.rounds  # 3 seeds
  with open(tmp_path / "summary.csv") as f:
    summary = list(csv.DictReader(f))
  assert [(s["algorithm"], int(s[fig5.E_COLUMN])) for s in summary] == [
      (n, e) for n in ("fedrep", "fedavg") for e in (1, 5)]
  for s in summary:
    assert 0 <= float(s["test_error"]) <= 1 and s["seeds"] == "3"
    assert float(s["test_error"]) == pytest.approx(1 - float(s["test_accuracy"]))
  # FedRep's E head epochs cost little; FedAvg's E epochs of the whole model more.
  flops = {(s["algorithm"], int(s[fig5.E_COLUMN])): float(s["flops_per_round"])
           for s in summary}
  assert flops["fedavg", 5] > 3 * flops["fedavg", 1]
  assert flops["fedrep", 1] < flops["fedrep", 5] < 2 * flops["fedrep", 1]
  assert (tmp_path / "fedrep-fig5.png").stat().st_size > 0
