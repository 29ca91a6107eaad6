"""Runs logged to TensorBoard and MLflow (`--log`, experiments/tracking.py), read back with
their own libraries: every metric of metrics.csv at its round, per run, the HParams and
params; each round logged once across a SIGKILL and --resume; `loop.run`'s callbacks."""

import csv
import glob
import json
import math
import os
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.plugins.hparams import plugin_data_pb2

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.experiments import tracking

IDENTITY = ("algorithm", "seed", "round", "grid", "lr")
SMALL = ["digits-personalized", "--quick", "--seeds", "2", "--set", "algorithms=fedrep,local",
         "--no-progress"]


def metrics_rows(out) -> list[dict]:
  with open(os.path.join(out, "metrics.csv")) as f:
    return list(csv.DictReader(f))


def run_name(row) -> str:
  """The tracked run of a metrics.csv row of digits-personalized."""
  grid = [row["grid"].replace(", ", ",")] if row.get("grid") else []
  return "/".join([row["algorithm"], *grid, f"seed{row['seed']}"])


def tensorboard_runs(out) -> dict:
  """{run name: EventAccumulator} of out/tensorboard, every event kept."""
  root = os.path.join(out, "tensorboard")
  runs = {}
  for folder, _, names in os.walk(root):
    if folder != root and any(".tfevents." in name for name in names):
      events = event_accumulator.EventAccumulator(
          folder, size_guidance={event_accumulator.SCALARS: 0}, purge_orphaned_data=False)
      events.Reload()
      runs[os.path.relpath(folder, root)] = events
  return runs


def raw_scalars(folder) -> list[tuple]:
  """(tag, step) of every scalar in every event file of `folder`, duplicates included."""
  found = []
  for path in sorted(glob.glob(os.path.join(folder, "*.tfevents.*"))):
    for event in event_file_loader.LegacyEventFileLoader(path).Load():
      found += [(value.tag, event.step) for value in event.summary.value
                if value.HasField("simple_value")]
  return found


def same(logged: float, written: str) -> bool:
  """Whether a logged value equals metrics.csv's cell (8 significant digits)."""
  value = float(written)
  return (math.isnan(logged) and math.isnan(value)) or math.isclose(logged, value,
                                                                    rel_tol=1e-6, abs_tol=1e-12)


def check_tensorboard_equals_metrics(out) -> int:
  """Asserts that every metric cell of metrics.csv is in its run's event files once, at its
  round, with its value; returns how many cells it checked."""
  runs, checked = tensorboard_runs(out), 0
  for row in metrics_rows(out):
    events = runs[run_name(row)]
    for tag, cell in row.items():
      if tag in IDENTITY or cell == "":
        continue
      at_round = [e.value for e in events.Scalars(tag) if e.step == int(row["round"])]
      assert len(at_round) == 1 and same(at_round[0], cell), (run_name(row), tag, row["round"])
      checked += 1
  return checked


@pytest.fixture(scope="module")
def logged_grid(tmp_path_factory):
  """`digits-personalized --quick --log tensorboard --log mlflow --grid lr=0.03,0.1`."""
  out = str(tmp_path_factory.mktemp("tracked") / "run")
  assert cli.main(["run", "digits-personalized", "--quick", "--log", "tensorboard", "--log",
                   "mlflow", "--grid", "lr=0.03,0.1", "--out", out, "--no-progress"]) == 0
  return out


@pytest.mark.slow
def test_tensorboard_holds_every_metric_of_every_run_and_the_hparams(logged_grid):
  rows = metrics_rows(logged_grid)
  runs = tensorboard_runs(logged_grid)
  assert set(runs) == {run_name(row) for row in rows}  # 6 algorithms x 3 seeds x 2 lr
  assert len(runs) == 36
  assert check_tensorboard_equals_metrics(logged_grid) > 5000
  evaluated = {int(r["round"]) for r in rows if r["test_accuracy"] != ""}
  steps = [e.step for e in runs["fedrep/lr=0.1/seed2"].Scalars("test_accuracy")]
  assert sorted(steps) == sorted(evaluated) and len(evaluated) == 8
  with open(os.path.join(logged_grid, "summary.csv")) as f:
    summary = {(e["algorithm"], e["grid"]): e for e in csv.DictReader(f)}
  for name, events in runs.items():
    algorithm, grid, seed = name.split("/")
    final = events.Scalars("summary/test_accuracy")
    assert len(final) == 1 and same(final[0].value, summary[algorithm, grid]["test_accuracy"])
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["algorithm"].string_value == algorithm
    assert hparams["lr"].number_value == float(grid.split("=")[1])
    assert hparams["seed"].number_value == int(seed.removeprefix("seed"))
  experiment = event_accumulator.EventAccumulator(os.path.join(logged_grid, "tensorboard"))
  experiment.Reload()
  content = experiment.PluginTagToContent("hparams")["_hparams_/experiment"]
  info = plugin_data_pb2.HParamsPluginData.FromString(content).experiment
  assert {h.name for h in info.hparam_infos} == {"algorithm", "seed", "lr"}
  assert "summary/test_accuracy" in {m.name.tag for m in info.metric_infos}


@pytest.mark.slow
def test_mlflow_holds_every_metric_of_every_run_and_the_params(logged_grid):
  client = MlflowClient(tracking_uri="sqlite:///" + os.path.join(logged_grid, "mlflow.db"))
  experiment = client.get_experiment_by_name("digits-personalized")
  runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
  rows = metrics_rows(logged_grid)
  assert set(runs) == {run_name(row) for row in rows} and len(runs) == 36
  histories = {}
  for row in rows:
    run = runs[run_name(row)]
    assert run.data.params == {"algorithm": row["algorithm"], "seed": row["seed"],
                               "lr": row["lr"]}
    assert run.info.status == "FINISHED"
    for tag, cell in row.items():
      if tag in IDENTITY or cell == "":
        continue
      key = (run.info.run_id, tag)
      if key not in histories:
        histories[key] = {}
        for m in client.get_metric_history(run.info.run_id, tag):
          assert m.step not in histories[key]  # each round once
          histories[key][m.step] = m.value
      assert same(histories[key][int(row["round"])], cell), (run_name(row), tag)
  assert "summary/test_accuracy" in runs["fedavg/lr=0.03/seed0"].data.metrics


@pytest.mark.slow  # the fast tier keeps the loop's callbacks
def test_a_small_run_logs_as_it_computes_and_its_logs_equal_metrics_csv(tmp_path, monkeypatch):
  """The rounds reach the event files while the run computes (each chunk, before the rows
  are logged), and the logs equal metrics.csv."""
  seen = []
  original = tracking.Tracker._rows

  def rows_logged(self, rows, combination):
    seen.append({name: sorted(step for tag, step in logged if tag == "train_loss")
                 for name, logged in self.sinks[0].logged.items()})
    original(self, rows, combination)

  monkeypatch.setattr(tracking.Tracker, "_rows", rows_logged)
  out = str(tmp_path / "run")
  assert cli.main(["run", *SMALL, "--set", "rounds=6", "--set", "eval_every=2", "--log",
                   "tensorboard", "--out", out]) == 0
  assert seen == [{f"{a}/seed{s}": [1, 2, 3, 4, 5, 6] for a in ("fedrep", "local")
                   for s in (0, 1)}]  # all rounds, live, before the rows came
  # per run: diverged_round, diverged and train_loss each round, 5 metrics each evaluation
  assert check_tensorboard_equals_metrics(out) == 2 * 2 * (6 * 3 + 3 * 5)
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["log"] == ["tensorboard"]


@pytest.mark.slow
def test_resume_after_a_sigkill_logs_each_round_once(tmp_path):
  out = str(tmp_path / "run")
  args = [*SMALL, "--set", "rounds=400", "--set", "eval_every=20", "--log", "tensorboard",
          "--log", "mlflow", "--checkpoint-every", "20"]
  process = subprocess.Popen([sys.executable, "-m", "fedjax_rep", "run", *args, "--out", out],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  logged, deadline = [], time.monotonic() + 300
  while len(logged) < 100:  # some rounds of the first unit in the event files
    assert process.poll() is None, process.communicate()
    assert time.monotonic() < deadline, "nothing was logged"
    time.sleep(0.2)
    logged = [s for folder in glob.glob(os.path.join(out, "tensorboard", "fedrep", "*"))
              for s in raw_scalars(folder)]
  process.kill()
  process.communicate()
  assert not os.path.exists(os.path.join(out, "metrics.csv"))
  assert cli.main(["run", "--resume", out, "--no-progress"]) == 0
  for folder, _, names in os.walk(os.path.join(out, "tensorboard")):
    if any(".tfevents." in n for n in names) and folder != os.path.join(out, "tensorboard"):
      found = raw_scalars(folder)
      assert len(found) == len(set(found)), folder  # every (tag, round) once
  assert check_tensorboard_equals_metrics(out) == 2 * 2 * (400 * 3 + 20 * 5)
  client = MlflowClient(tracking_uri="sqlite:///" + os.path.join(out, "mlflow.db"))
  for run in client.search_runs([client.get_experiment_by_name(
      "digits-personalized").experiment_id]):
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
    assert sorted(steps) == list(range(1, 401)), run.info.run_name


@pytest.mark.slow  # the fast tier keeps the loop's callbacks and the refusals
def test_run_recipe_logs_into_log_dir_and_refuses_one_with_logs(tmp_path):
  log_dir = str(tmp_path / "logs")
  rows, _ = fr.run_recipe("digits-personalized", quick=True, seeds=1, progress=False,
                          overrides=["algorithms=fedrep", "rounds=2", "eval_every=1"],
                          log="tensorboard", log_dir=log_dir)
  events = tensorboard_runs(log_dir)["fedrep/seed0"]
  assert [e.value for e in events.Scalars("train_loss")] == pytest.approx(
      [row["train_loss"] for row in rows])
  with pytest.raises(fr.ConfigError, match="already holds tensorboard"):
    fr.run_recipe("digits-personalized", quick=True, log="tensorboard", log_dir=log_dir)


@pytest.mark.parametrize("log, message", [
    ("wandb", "'wandb' is not a tracker: choose from tensorboard, mlflow"),
    (("mlflow", "mlflow"), "names a tracker twice"),
])
def test_a_bad_tracker_is_refused_before_any_work(log, message):
  with pytest.raises(fr.ConfigError, match=message):
    fr.run_recipe("digits-personalized", quick=True, log=log)


def test_a_tracker_whose_library_is_missing_says_how_to_install_it(monkeypatch, tmp_path):
  found = tracking.importlib.util.find_spec
  monkeypatch.setattr(tracking.importlib.util, "find_spec",
                      lambda name: None if name == "tensorboardX" else found(name))
  with pytest.raises(fr.ConfigError, match=r"needs tensorboardX, which is not installed: "
                     r"pip install '\.\[tracking\]'"):
    fr.run_to_dir("digits-personalized", quick=True, log=["tensorboard"],
                  out=str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")


def test_resume_reads_the_trackers_from_config_json(tmp_path, capsys):
  assert cli.main(["run", "--resume", str(tmp_path), "--log", "mlflow"]) == 2
  assert "do not also give --log" in capsys.readouterr().err


def test_loop_callbacks_get_each_chunk_its_evaluation_and_the_state_when_asked():
  data = fr.digits.federated(10, "classes", 2, seed=0)
  algorithm = fr.make_neural_algorithm("fedrep", model=fr.make_model("digits-mlp", 10),
                                       cohort=5)
  hparams = fr.nn_hparams(lr=0.1)
  chunks, states = [], []
  result = fr.run(algorithm, data, hparams, jax.random.key(0), 7, chunk=3, eval_every=2,
                  progress=False, callbacks=[chunks.append], callback_state=True)
  assert [list(c.rounds) for c in chunks] == [[1, 2], [3], [4], [5, 6], [7]]
  assert [c.round for c in chunks] == [2, 3, 4, 6, 7]
  np.testing.assert_array_equal(np.concatenate([c.metrics["train_loss"] for c in chunks]),
                                result.metrics["train_loss"])
  evaluated = [c for c in chunks if c.eval_metrics]
  assert [c.round for c in evaluated] == list(result.eval_rounds) == [2, 4, 6, 7]
  np.testing.assert_array_equal([c.eval_metrics["test_accuracy"] for c in evaluated],
                                result.eval_metrics["test_accuracy"])
  final = jax.tree.leaves(chunks[-1].state)
  assert all(isinstance(leaf, np.ndarray) for leaf in final)
  for leaf, expected in zip(final, jax.tree.leaves(result.state)):
    np.testing.assert_array_equal(leaf, np.asarray(expected))
  fr.run(algorithm, data, hparams, jax.random.key(0), 2, progress=False,
         callbacks=[states.append])
  assert states[0].state is None  # not asked for
