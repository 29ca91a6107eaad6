"""A neural grid as one program: the traced keys (lr, momentum, weight decay, the algorithms'
options) of every combination run with the seeds as one vmapped program per algorithm
program, with the numbers of the combinations run one at a time; chunks where memory is
short; compiled once."""

import jax
import numpy as np
import pytest

from fedjax_rep.data import digits, federated
from fedjax_rep.nn import models
from fedjax_rep.experiments import batch as batch_lib
from fedjax_rep.recipes.kit import neural
from fedjax_rep.experiments import runner

SMALL = ["rounds=2", "eval_every=1", "algorithms=fedrep,fedavg", "num_clients=10"]
GRID = {"lr": (0.01, 0.1), "momentum": (0.0, 0.5)}


def by_run(rows, keys=("lr", "momentum")):
  """{(algorithm, seed, round, *swept values): row}."""
  return {(r["algorithm"], r["seed"], r["round"], *(r.get(k) for k in keys)): r for r in rows}


@pytest.mark.slow  # the fast tier keeps the one-program sweeps of an option, below
def test_a_grid_of_traced_keys_is_one_program_with_the_numbers_of_each_setting(compiles):
  rows, _ = runner.run("digits-personalized", quick=True, seeds=2, overrides=SMALL,
                       grid=GRID, progress=False)
  loops = [n for n in compiles.names if n == "jit(_run_chunk)"]
  assert len(loops) == 1  # 4 settings x 2 seeds x 2 algorithms: one program
  grid_rows = by_run(rows)
  for lr in GRID["lr"]:
    for momentum in GRID["momentum"]:
      alone, _ = runner.run("digits-personalized", quick=True, seeds=2, progress=False,
                            overrides=[*SMALL, f"lr={lr}", f"momentum={momentum}"])
      for row in alone:
        swept = grid_rows[(row["algorithm"], row["seed"], row["round"], lr, momentum)]
        for key in ("train_loss", "test_accuracy"):
          if key in row:
            np.testing.assert_allclose(swept[key], row[key], rtol=2e-5, atol=1e-6,
                                       err_msg=f"{key} lr={lr} momentum={momentum}")


def test_an_option_of_the_algorithms_is_swept_in_the_same_program(compiles):
  rows, _ = runner.run("digits-personalized", quick=True, seeds=1, progress=False,
                       overrides=["rounds=2", "eval_every=1", "algorithms=fed-mtl",
                                  "num_clients=10"],
                       grid={"mtl_lambda": (0.0, 0.5), "lr": (0.01, 0.1)})
  assert [n for n in compiles.names if n == "jit(_run_chunk)"] == ["jit(_run_chunk)"]
  assert {(r["mtl_lambda"], r["lr"]) for r in rows} == {
      (m, lr) for m in (0.0, 0.5) for lr in (0.01, 0.1)}
  finals = {(r["mtl_lambda"], r["lr"]): r["test_accuracy"] for r in rows if r["round"] == 2}
  assert len(set(finals.values())) > 1  # the options reached the program


def test_a_baselines_number_is_a_traced_option_swept_in_one_program(compiles):
  rows, _ = runner.run("digits-personalized", quick=True, seeds=1, progress=False,
                       overrides=["rounds=2", "eval_every=1", "algorithms=fedprox",
                                  "num_clients=10"],
                       grid={"prox_mu": (0.001, 10.0)})
  assert [n for n in compiles.names if n == "jit(_run_chunk)"] == ["jit(_run_chunk)"]
  assert {r["prox_mu"] for r in rows} == {0.001, 10.0}
  finals = {r["prox_mu"]: r["train_loss"] for r in rows if r["round"] == 2}
  assert len(set(finals.values())) > 1  # prox_mu reached the program


@pytest.mark.slow  # the fast tier keeps the padded last call, below
def test_settings_that_do_not_fit_run_in_calls_of_one_program(capsys, compiles):
  config = neural.Training()
  data = federated.stack([digits.federated(10, "classes", 2, seed=s) for s in (0, 1)])
  model = models.make_model("digits-mlp", digits.NUM_CLASSES)
  own = neural.algorithm("fedrep", config, model, 10)
  keys = neural.run_keys([0, 1])
  settings = [neural.hparams_lib.hparams(lr) for lr in (0.01, 0.02, 0.05)]
  _, per_setting = batch_lib.settings_that_fit(own, data, settings[0], keys, available=10**12)
  data_bytes = sum(a.nbytes for a in jax.tree.leaves(data))
  whole = batch_lib.Batch(progress=False, width=3).train("fedrep", own, data, settings, keys, 2,
                                                         eval_every=1)
  compiles.reset()
  # Room for the data and one setting (of 2 seeds) at a time: 3 calls of one setting.
  chunked = batch_lib.Batch(progress=False, width=3,
                            available=int((data_bytes + 1.5 * per_setting) / 0.9)).train(
                                "fedrep", own, data, settings, keys, 2, eval_every=1)
  assert "running them in calls of 1" in capsys.readouterr().err
  assert [n for n in compiles.names if n == "jit(_run_chunk)"] == ["jit(_run_chunk)"]
  assert len(chunked) == len(whole) == 3
  for a, b in zip(whole, chunked):
    np.testing.assert_allclose(a["metrics"]["train_loss"], b["metrics"]["train_loss"],
                               rtol=2e-5)
    np.testing.assert_allclose(a["eval"]["test_accuracy"], b["eval"]["test_accuracy"],
                               atol=1e-6)


def test_the_last_call_is_padded_to_the_same_program(compiles):
  config = neural.Training()
  data = federated.stack([digits.federated(10, "classes", 2, seed=0)])
  model = models.make_model("digits-mlp", digits.NUM_CLASSES)
  own = neural.algorithm("fedavg", config, model, 10)
  keys = neural.run_keys([0])
  settings = [neural.hparams_lib.hparams(lr) for lr in (0.01, 0.02, 0.05)]
  # Two settings a call: calls of (0.01, 0.02) and (0.05, 0.05 padded).
  results = batch_lib.Batch(progress=False, width=2).train("fedavg", own, data, settings, keys,
                                                           2, eval_every=1)
  assert len(results) == 3
  assert [n for n in compiles.names if n == "jit(_run_chunk)"] == ["jit(_run_chunk)"]
  assert all(r["metrics"]["train_loss"].shape == (1, 2) for r in results)


@pytest.mark.parametrize("recipe", ["digits-personalized", "table1-synthetic",
                                    "fedrep-table1-cifar10", "flute-table1"])
def test_the_neural_recipes_trace_their_hparams_and_options(recipe):
  from fedjax_rep.experiments import recipe_registry
  found = recipe_registry.get(recipe)
  config = recipe_registry.resolve(recipe, quick=True)
  keys = found.traced(config)
  assert {"lr", "momentum", "weight_decay"} <= set(keys)
