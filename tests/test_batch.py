"""The batch runner (experiments/batch.py): the one place that calls `loop.run` outside core/,
the data held once whatever the number of settings, grids of every recipe as one compiled
program with the numbers of their combinations run one at a time, live trackers in every
recipe family."""

import ast
import csv
import os

import jax
import numpy as np
import pytest

from fedjax_rep import cli
from fedjax_rep.core import loop
from fedjax_rep.data import digits, federated
from fedjax_rep.experiments import batch as batch_lib
from fedjax_rep.recipes.kit import neural
from fedjax_rep.experiments import runner
from fedjax_rep.experiments import tracking
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import models

PACKAGE = os.path.join(os.path.dirname(__file__), os.pardir, "fedjax_rep")


def calls_of(path: str, names: set[str]) -> list[str]:
  """The calls in the module at `path` of `loop.NAME` for NAME in `names` (as 'loop.NAME')."""
  with open(path) as f:
    tree = ast.parse(f.read())
  return [f"loop.{node.func.attr}" for node in ast.walk(tree)
          if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in names and isinstance(node.func.value, ast.Name)
          and node.func.value.id == "loop"]


def test_the_batch_runner_is_the_one_caller_of_the_round_loop_outside_core():
  callers = {}
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      path = os.path.join(folder, name)
      if name.endswith(".py") and os.path.basename(folder) != "core":
        found = calls_of(path, {"run", "init_state"})
        if found:
          callers[os.path.relpath(path, PACKAGE)] = found
  assert callers == {os.path.join("experiments", "batch.py"): ["loop.run", "loop.init_state"]}


def small_problem(seeds=(0, 1)):
  config = neural.Training()
  data = federated.stack([digits.federated(10, "classes", 2, seed=s) for s in seeds])
  model = models.make_model("digits-mlp", digits.NUM_CLASSES)
  return neural.algorithm("fedavg", config, model, 10), data, neural.run_keys(list(seeds))


def test_settings_over_runs_pass_the_data_once_and_equal_each_setting_alone(monkeypatch):
  """Three settings in one call of width 3: `loop.run` gets the runs' data as they are (no
  settings axis: nested sweeps, the data's axis None over the settings) and the settings'
  varying leaves stacked; each setting's numbers equal it run alone within float32
  rounding."""
  algorithm, data, keys = small_problem()
  settings = [hparams_lib.hparams(lr, 0.5, 1e-4) for lr in (0.01, 0.03, 0.1)]
  seen = []
  original = loop.run

  def spy(algorithm, data, hparams, keys, rounds, **kwargs):
    seen.append((jax.tree.leaves(data)[0].shape, kwargs["sweep_axes"], hparams))
    return original(algorithm, data, hparams, keys, rounds, **kwargs)

  monkeypatch.setattr(batch_lib.loop, "run", spy)
  together = batch_lib.Batch(progress=False, width=3).train("fedavg", algorithm, data,
                                                            settings, keys, 3, eval_every=3)
  ((shape, sweep_axes, hparams),) = seen
  assert shape[0] == 2  # the two seeds' data, not 3 x 2 copies
  (data_axis, hparams_axes, key_axis), inner = sweep_axes
  assert data_axis is None and key_axis is None and inner == (0, None, 0)
  assert hparams_axes.lr == 0 and hparams_axes.momentum is None  # only lr varies
  np.testing.assert_allclose(np.asarray(hparams.lr), [0.01, 0.03, 0.1], rtol=1e-7)
  alone = batch_lib.Batch(progress=False, width=1).train("fedavg", algorithm, data, settings,
                                                         keys, 3, eval_every=3)
  assert [s[1] for s in seen[1:]] == [(0, None, 0)] * 3
  for a, b in zip(together, alone):
    assert a["metrics"]["train_loss"].shape == (2, 3)
    np.testing.assert_allclose(a["metrics"]["train_loss"], b["metrics"]["train_loss"],
                               rtol=2e-5)
    np.testing.assert_allclose(a["eval"]["test_accuracy"], b["eval"]["test_accuracy"],
                               atol=1e-6)


def test_the_default_width_is_the_backends():
  assert batch_lib.default_width("cpu") == 1
  assert batch_lib.default_width("gpu") is None  # as many as fit in memory


def test_members_of_padded_settings_are_not_logged():
  """A call of width 2 with one real setting (the last call, padded): its tracker callback
  sees the real setting's runs only."""
  logged = []

  class Tracker:
    def live(self, members):
      return lambda chunk: logged.append((members, {k: v.shape for k, v in chunk.metrics.items()}))

  algorithm, data, keys = small_problem(seeds=(0,))
  settings = [hparams_lib.hparams(lr) for lr in (0.01, 0.02, 0.05)]
  members = [[{"algorithm": "fedavg", "seed": 0, "lr": lr}] for lr in (0.01, 0.02, 0.05)]
  batch_lib.Batch(progress=False, width=2, tracker=Tracker()).train(
      "fedavg", algorithm, data, settings, keys, 2, eval_every=2, members=members)
  assert [m for m, _ in logged] == [members[0] + members[1], members[2]]
  assert logged[0][1]["train_loss"] == (2, 2) and logged[1][1]["train_loss"] == (1, 2)


def rows_by_run(rows, keys) -> dict:
  return {tuple(r.get(k) for k in keys): r for r in rows}


@pytest.mark.slow
@pytest.mark.parametrize("recipe, overrides, grid", [
    ("fedavg-ft-neural", ["rounds=4", "local_steps=2", "num_clients=10", "eval_every=2",
                          "finetune_epochs=2", "unseen_clients=2"], (0.02, 0.05, 0.1)),
    ("srpfl-neural", ["rounds=6", "stage_rounds=2", "num_clients=10", "algorithms=srpfl,flanp",
                      "comm_costs=0,10"], (0.02, 0.05)),
])
def test_a_grid_of_lr_is_one_program_with_the_numbers_of_each_value_alone(
    recipe, overrides, grid, compiles):
  """fedavg-ft-neural and srpfl-neural sweep a grid of lr with the round programs of one
  value (compiled once each), and each combination's rows equal those of its lr run
  alone."""
  loops = lambda: [n for n in compiles.names if n == "jit(_run_chunk)"]
  jax.clear_caches()
  compiles.reset()
  alone = {grid[0]: runner.run(recipe, quick=True, seeds=2, progress=False,
                               overrides=[*overrides, f"lr={grid[0]}"])[0]}
  programs = loops()
  jax.clear_caches()
  compiles.reset()
  rows, _ = runner.run(recipe, quick=True, seeds=2, overrides=overrides, grid={"lr": grid},
                       progress=False)
  assert loops() == programs
  keys = ("algorithm", "seed", "round", "comm_cost", "speed_model", "finetune_samples",
          "class_a", "class_b")
  for lr in grid:
    if lr not in alone:
      alone[lr] = runner.run(recipe, quick=True, seeds=2, progress=False,
                             overrides=[*overrides, f"lr={lr}"])[0]
    mine, theirs = (rows_by_run(each, keys) for each in ([r for r in rows if r["lr"] == lr],
                                                         alone[lr]))
    assert mine.keys() == theirs.keys()
    for key, row in theirs.items():
      for column, value in row.items():
        if isinstance(value, float):
          np.testing.assert_allclose(mine[key][column], value, rtol=1e-5, atol=1e-6,
                                     err_msg=f"{key} {column}")


@pytest.mark.slow
@pytest.mark.parametrize("recipe, overrides, tag", [
    ("flute-fig3", ["rounds=20"], "model_error"),
    ("srpfl-linear", ["rounds=40", "floor_rounds=20", "num_clients=30", "n0=5"],
     "principal_angle"),
    ("srpfl-neural", ["comm_costs=0"], "train_loss"),
])
def test_a_recipe_of_each_family_logs_each_round_as_it_computes(
    recipe, overrides, tag, tmp_path, monkeypatch):
  """Every round of every run reaches the tracker while the recipe runs (each chunk, before
  metrics.csv's rows are logged), under the run names that the rows log them by.
  (srpfl-neural trains at the first comm_cost and logs the others' rows at the end: one
  here.)"""
  snapshots = []
  original = tracking.Tracker._rows

  def rows_logged(self, rows, combination):
    snapshots.append({name: sorted(step for t, step in logged if t == tag)
                      for name, logged in self.sinks[0].logged.items()})
    original(self, rows, combination)
    snapshots.append({name: sorted(step for t, step in logged if t == tag)
                      for name, logged in self.sinks[0].logged.items()})

  monkeypatch.setattr(tracking.Tracker, "_rows", rows_logged)
  out = str(tmp_path / "run")
  assert cli.main(["run", recipe, "--quick", "--seeds", "2", "--no-progress", "--log",
                   "tensorboard", "--out", out, *[a for o in overrides for a in ("--set", o)]]
                  ) == 0
  live, final = snapshots
  with open(os.path.join(out, "metrics.csv")) as f:
    rounds = max(int(r["round"]) for r in csv.DictReader(f))
  assert live == final and len(live) > 1
  assert all(steps == list(range(1, rounds + 1)) for steps in live.values())
