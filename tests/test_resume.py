"""Nothing lost: checkpoints inside a run (orbax) and their resume, byte-identical after a
SIGKILL or a SIGTERM; --resume and --from-config; what --out accepts; files as the umask
says."""

import csv
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.core import checkpoint
from fedjax_rep.experiments import runner

# fedrep-fig3, small: one padded unit of n = 10, 20; 3 algorithms x 2 seeds.
SMALL = ["--set", "num_clients=10,20", "--set", "samples_per_client=4", "--seeds", "2"]


def metrics_text(out):
  with open(os.path.join(out, "metrics.csv")) as f:
    return f.read()


def tiny_problem(seeds=3):
  """A sweep of `seeds` linear FedAvg runs on fixed data, the last one diverging (lr 5)."""
  keys = jax.random.split(jax.random.key(0), seeds)
  problem = jax.vmap(lambda k: fr.make_problem(k, 8, 6, 2, 0.1))(keys)
  data = jax.vmap(lambda k, p: fr.make_fixed_data(k, p, 5))(keys, problem)
  lr = jnp.array([0.1] * (seeds - 1) + [5.0], jnp.float32)
  hparams = fr.LinearHparams(lr=lr, head_lr=lr)
  return fr.make_algorithm("fedavg", rep_dim=2, cohort=4), data, hparams, keys


@pytest.mark.slow  # the fast tier keeps test_faults' SIGKILL mid-save, resumed byte-identical
def test_a_run_stopped_and_resumed_from_its_checkpoint_equals_an_uninterrupted_one(
    tmp_path, monkeypatch):
  """A sweep with a diverging run: stopped (as by SIGTERM) after round 20, then run again in
  the same scope, it continues from its checkpoint and ends with the same metrics, flags
  and state as a run that was never stopped."""
  algorithm, data, hparams, keys = tiny_problem()
  sweep = dict(sweep_axes=(0, 0, 0), chunk=10, progress=False)
  whole = fr.run(algorithm, data, hparams, keys, 60, **sweep)
  assert whole.diverged.tolist() == [False, False, True]

  stopping = checkpoint.Scope(str(tmp_path), every_rounds=None, every_seconds=None,
                              stop=lambda: "SIGTERM")
  with pytest.raises(checkpoint.Interrupted, match="SIGTERM at round 10 of 60"):
    fr.run(algorithm, data, hparams, keys, 60, **sweep, checkpoints=stopping)
  (slot,) = os.listdir(tmp_path)  # named by what the run computes
  assert re.fullmatch(r"fedavg-[0-9a-f]{12}", slot)
  assert os.listdir(tmp_path / slot) == ["10"]
  resumed = fr.run(algorithm, data, hparams, keys, 60, **sweep,
                   checkpoints=checkpoint.Scope(str(tmp_path), every_rounds=20))
  for name in whole.metrics:
    np.testing.assert_array_equal(resumed.metrics[name], whole.metrics[name])
  np.testing.assert_array_equal(resumed.diverged, whole.diverged)
  for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state)):
    np.testing.assert_array_equal(a, b)
  assert os.listdir(tmp_path / slot) == ["40"]  # the latest kept, none at the last round


def restored_steps(monkeypatch) -> list:
  """(checkpoint directory's name, round restored or None) of every restore from now on."""
  steps, restore = [], checkpoint.Slot.restore

  def record(self, carry_like):
    restored = restore(self, carry_like)
    steps.append((os.path.basename(self.directory), None if restored is None else restored[0]))
    return restored

  monkeypatch.setattr(checkpoint.Slot, "restore", record)
  return steps


def two_runs(seeds=3):
  """run(name): the calls "a" and "b" of one unit, 60 rounds of one algorithm (states of one
  shape) with other keys and step sizes (`tiny_problem`)."""
  algorithm, data, hparams, keys = tiny_problem(seeds)
  calls = {"a": (hparams, keys),
           "b": (jax.tree.map(lambda x: x / 2, hparams),
                 jax.random.split(jax.random.key(1), seeds))}

  def run(name, checkpoints=None):
    return fr.run(algorithm, data, *calls[name], 60, sweep_axes=(0, 0, 0), chunk=10,
                  progress=False, checkpoints=checkpoints)

  return run


@pytest.mark.slow  # the fast tier keeps test_faults' SIGKILL mid-save, resumed byte-identical
def test_two_runs_of_one_unit_resumed_in_swapped_order_get_their_own_state(
    tmp_path, monkeypatch):
  """A unit runs a then b; stopped inside b (a's last checkpoint, round 40, left beside b's
  first, round 10), it is resumed with b first, then a: each restores its own checkpoint
  (named by what it computes, not by call order) and ends with the metrics, byte for byte,
  the flags and the state of an uninterrupted run, never the other call's."""
  run = two_runs()
  whole = {name: run(name) for name in "ab"}
  stops = iter([None] * 6 + ["SIGTERM"])  # a's six chunks, then b's first
  scope = checkpoint.Scope(str(tmp_path), every_rounds=20, every_seconds=None,
                           stop=lambda: next(stops))
  run("a", scope)
  with pytest.raises(checkpoint.Interrupted, match="SIGTERM at round 10 of 60"):
    run("b", scope)
  saved = {name: os.listdir(tmp_path / name) for name in os.listdir(tmp_path)}
  assert sorted(saved.values()) == [["10"], ["40"]]
  steps = restored_steps(monkeypatch)
  scope = checkpoint.Scope(str(tmp_path), every_rounds=20, every_seconds=None)
  resumed = {name: run(name, scope) for name in "ba"}
  assert [(saved[name], step) for name, step in steps] == [(["10"], 10), (["40"], 40)]
  for name in "ab":
    assert resumed[name].metrics.keys() == whole[name].metrics.keys()
    for metric, values in whole[name].metrics.items():
      got = resumed[name].metrics[metric]
      assert got.dtype == values.dtype and got.tobytes() == values.tobytes(), (name, metric)
    np.testing.assert_array_equal(resumed[name].diverged, whole[name].diverged)
    for a, b in zip(jax.tree.leaves(resumed[name].state), jax.tree.leaves(whole[name].state)):
      np.testing.assert_array_equal(a, b)


def test_two_runs_of_one_unit_with_one_identity_are_refused_in_one_line(tmp_path):
  """A second call of a unit that computes what an earlier one did would share its
  checkpoints: refused before it runs, naming the checkpoint and what to do."""
  run = two_runs()
  scope = checkpoint.Scope(str(tmp_path))
  run("a", scope)
  with pytest.raises(checkpoint.IdentityError) as refused:
    run("a", scope)
  assert re.fullmatch(
      rf"two runs of one unit would share the checkpoint {tmp_path}/fedavg-[0-9a-f]{{12}} "
      r"\(the same algorithm, key, hparams, rounds and data shapes\): give them different "
      r"keys, or run them in units of their own", str(refused.value))


def test_a_checkpoint_that_records_another_run_is_refused_in_one_line(tmp_path, monkeypatch):
  """b's checkpoint directory holding a's checkpoint (as a clash of names would): b's resume
  refuses it in one line naming it and what differs, and deletes nothing."""
  run = two_runs()
  for name in "ab":
    with pytest.raises(checkpoint.Interrupted):
      run(name, checkpoint.Scope(str(tmp_path / name), stop=lambda: "SIGTERM"))
  (b_slot,) = os.listdir(tmp_path / "b")
  (a_slot,) = os.listdir(tmp_path / "a")
  assert a_slot != b_slot
  shutil.rmtree(tmp_path / "b" / b_slot)
  shutil.move(tmp_path / "a" / a_slot, tmp_path / "b" / b_slot)
  with pytest.raises(checkpoint.IdentityError) as refused:
    run("b", checkpoint.Scope(str(tmp_path / "b")))
  directory = tmp_path / "b" / b_slot
  assert str(refused.value) == (
      f"checkpoint {directory}/10 holds another run (its hparams, key differ from this "
      f"call's): delete {directory} to run this call from its start, or start the whole run "
      f"over (--overwrite)")
  assert os.listdir(directory) == ["10"]


@pytest.mark.slow
def test_evaluations_survive_a_resume(tmp_path, monkeypatch):
  """A neural run that evaluates every 2 rounds, stopped after round 2 and resumed: the
  evaluations before the stop come back from the checkpoint."""
  data = jax.tree.map(lambda a: a[:8], fr.digits.federated(8, "classes", 2, seed=0))
  algorithm = fr.make_neural_algorithm("fedrep", model=fr.make_model("digits-mlp", 10),
                                       cohort=4, head_epochs=1, batch_size=8, client_group=4)
  hparams = fr.nn_hparams(0.05, 0.5, 0.0)
  run = dict(eval_every=2, chunk=2, progress=False)
  whole = fr.run(algorithm, data, hparams, jax.random.key(0), 6, **run)
  calls = iter([None, "SIGINT"])
  with pytest.raises(checkpoint.Interrupted):
    fr.run(algorithm, data, hparams, jax.random.key(0), 6, **run,
           checkpoints=checkpoint.Scope(str(tmp_path), stop=lambda: next(calls)))
  resumed = fr.run(algorithm, data, hparams, jax.random.key(0), 6, **run,
                   checkpoints=checkpoint.Scope(str(tmp_path)))
  np.testing.assert_array_equal(resumed.eval_rounds, [2, 4, 6])
  for name in whole.eval_metrics:
    np.testing.assert_array_equal(resumed.eval_metrics[name], whole.eval_metrics[name])
  np.testing.assert_array_equal(resumed.metrics["train_loss"], whole.metrics["train_loss"])


def run_cli(args, **kwargs):
  return subprocess.Popen([sys.executable, "-m", "fedjax_rep", "run", *args, "--no-progress"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def checkpoint_steps(out) -> list[int]:
  """The rounds of the checkpoints saved so far by the units of the run in `out`."""
  paths = glob.glob(os.path.join(out, "parts", "*.ckpt", "*", "[0-9]*"))
  return [int(os.path.basename(p)) for p in paths if os.path.basename(p).isdigit()]


def wait_for_checkpoint(out, process, after=0, timeout=120):
  """Waits until the run in `out` (in `process`) has saved a checkpoint past round `after`."""
  deadline = time.monotonic() + timeout
  while max(checkpoint_steps(out), default=0) <= after:
    assert process.poll() is None, process.communicate()
    assert time.monotonic() < deadline, "no checkpoint was saved"
    time.sleep(0.02)


@pytest.mark.slow
def test_sigkill_then_sigterm_at_random_moments_then_resume_is_byte_identical(tmp_path):
  """The command line, a sweep over seeds and lr where lr = 1 diverges, killed by SIGKILL at a
  random moment inside its unit (after a first checkpoint), resumed and stopped by SIGTERM
  (exit 143, prints how to resume), resumed again: metrics.csv is byte-identical to an
  uninterrupted run's."""
  rounds = ["--set", "rounds=6000", "--checkpoint-every", "250", "--grid", "lr=0.1,1"]
  reference = str(tmp_path / "reference")
  assert cli.main(["run", *SMALL, *rounds, "--out", reference, "--no-progress"]) == 0
  out = str(tmp_path / "run")
  process = run_cli([*SMALL, *rounds, "--out", out])
  wait_for_checkpoint(out, process)
  time.sleep(random.uniform(0, 0.5))
  assert process.poll() is None, "the run ended before it could be killed: make it longer"
  process.kill()
  process.communicate()
  killed_at = max(checkpoint_steps(out))
  assert not os.path.exists(os.path.join(out, "metrics.csv"))

  process = run_cli(["--resume", out, "--checkpoint-every", "250"])
  wait_for_checkpoint(out, process, after=killed_at)
  process.send_signal(signal.SIGTERM)
  stdout, stderr = process.communicate(timeout=120)
  assert process.returncode == 128 + signal.SIGTERM, stderr
  assert f"Resume with:\n  fedjax-rep run --resume {out}" in stderr
  assert not os.path.exists(os.path.join(out, "metrics.csv"))

  assert cli.main(["run", "--resume", out, "--no-progress"]) == 0
  assert metrics_text(out) == metrics_text(reference)
  assert not checkpoint_steps(out)  # deleted once the unit is saved
  with open(os.path.join(out, "metrics.csv")) as f:
    assert any(float(row["diverged"]) == 1 for row in csv.DictReader(f))  # lr = 1 diverged


def test_same_seed_same_bytes_and_from_config_replays(tmp_path):
  first, second, replay = (str(tmp_path / name) for name in ("first", "second", "replay"))
  args = [*SMALL, "--set", "rounds=4", "--no-progress", "--grid", "lr=0.1,0.2"]
  assert cli.main(["run", *args, "--out", first]) == 0
  assert cli.main(["run", *args, "--out", second]) == 0
  assert metrics_text(first) == metrics_text(second)
  assert cli.main(["run", "--from-config", os.path.join(first, "config.json"), "--out",
                   replay, "--no-progress"]) == 0
  assert metrics_text(replay) == metrics_text(first)
  with open(os.path.join(replay, "config.json")) as f:
    saved = json.load(f)
  assert saved["grid"] == {"lr": [0.1, 0.2]} and saved["code"]["source"]
  assert "num_clients=10,20" in runner.replay(os.path.join(first, "config.json"))["overrides"]


@pytest.mark.parametrize("setup,args,message", [
    ("file", [], "is a file, not a directory"),
    ("under-file", [], r"cannot be created \(Not a directory\)"),
    ("notes", [], r"is not empty and not a run of fedrep-fig3 \(it holds files that are not"),
    ("other-config", [], "holds a run with a different configuration"),
    ("other-code", [], "holds parts written by other code"),
    ("run", ["--quick"], "--resume reads the recipe.*do not also give --quick"),
    ("new", ["--checkpoint-every", "0"], r"every_rounds \(--checkpoint-every\) must be an "
     r"integer >= 1 or None, got 0"),
    ("new", ["--checkpoint-seconds", "-1"], r"\(--checkpoint-seconds\) must be a number > 0"),
])
def test_bad_out_and_resume_are_one_line_errors(tmp_path, capsys, setup, args, message):
  out = str(tmp_path / "out")
  base = [*SMALL, "--set", "rounds=2", "--no-progress"]
  if setup == "file":
    open(out, "w").close()
  elif setup == "under-file":
    open(out, "w").close()
    out = os.path.join(out, "sub")
  elif setup == "notes":
    os.makedirs(out)
    open(os.path.join(out, "notes.txt"), "w").close()
  elif setup != "new":  # a run in `out` first
    assert cli.main(["run", *base, "--out", out]) == 0
    capsys.readouterr()
  if setup == "other-config":
    base = base + ["--set", "lr=0.2"]
  if setup == "other-code":
    with open(os.path.join(out, "config.json")) as f:
      saved = json.load(f)
    saved["code"]["source"] = "0" * 64
    with open(os.path.join(out, "config.json"), "w") as f:
      json.dump(saved, f)
  command = (["run", "--resume", out, *args] if setup == "run" else
             ["run", *base, "--out", out, *args])
  assert cli.main(command) == 2
  error = capsys.readouterr().err
  assert len(error.strip().splitlines()) == 1
  assert error.startswith("fedjax-rep: error: ")
  assert re.search(message, error), error
  if setup in ("notes", "other-config", "other-code"):  # --overwrite: written over
    assert cli.main([*command, "--overwrite"]) == 0
    assert os.path.exists(os.path.join(out, "metrics.csv"))


def test_files_are_written_as_the_umask_says(tmp_path):
  out = str(tmp_path / "out")
  old = os.umask(0o027)
  try:
    assert cli.main(["run", *SMALL, "--set", "rounds=2", "--no-progress", "--out", out]) == 0
  finally:
    os.umask(old)
  for name in ("metrics.csv", "config.json", "fedrep-fig3.png", "parts/n10-20-settings0-0.npz"):
    assert os.stat(os.path.join(out, name)).st_mode & 0o777 == 0o640, name
