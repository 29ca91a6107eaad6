"""One writer per run directory, and faults survived: a second run or --resume on a
directory in use is refused naming the holder (whose SIGKILL frees it); --resume of a
complete run writes nothing; a full disk (ENOSPC) while writing metrics.csv or a
checkpoint, a checkpoint write that the system refuses, a damaged checkpoint or unit, and a
SIGKILL in the middle of a save each lose nothing: the resumed run's metrics.csv is
byte-identical to an uninterrupted run's."""

import errno
import glob
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from fedjax_rep import cli
from fedjax_rep.core import checkpoint
from fedjax_rep.experiments import outputs
from fedjax_rep.experiments import runner
from test_resume import SMALL, metrics_text, run_cli, wait_for_checkpoint

ARGS = [*SMALL, "--set", "algorithms=fedrep", "--set", "rounds=6", "--no-progress"]
# The checkpoints of ARGS' one unit (FedRep alone: one setting; a glob): its run's, named by
# what it computes.
CHECKPOINTS = "parts/n10-20.ckpt/fedrep-" + "[0-9a-f]" * 12


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """metrics.csv of ARGS run without a fault."""
  out = str(tmp_path_factory.mktemp("reference") / "run")
  assert cli.main(["run", *ARGS, "--out", out]) == 0
  return metrics_text(out)


def snapshot(out, skip: str | None = None) -> dict:
  """{path: (bytes, mtime in ns)} of every file under `out`, hidden ones included, except
  under its folder `skip` (e.g. the parts a running holder keeps checkpointing: files come
  and go there while the walk reads them)."""
  files = {}
  for directory, folders, names in os.walk(out):
    if directory == out and skip in folders:
      folders.remove(skip)
    for name in names:
      path = os.path.join(directory, name)
      with open(path, "rb") as f:
        files[path] = (f.read(), os.stat(path).st_mtime_ns)
  return files


def checkpoints(out) -> str:
  """The directory of the checkpoints of ARGS' one unit in `out` (CHECKPOINTS)."""
  (path,) = glob.glob(os.path.join(out, CHECKPOINTS))
  return path


def one_line(text: str) -> str:
  lines = text.strip().splitlines()
  assert len(lines) == 1, text
  return lines[0]


def restored_steps(monkeypatch) -> list:
  """(the round restored, None for none; what is left in the checkpoint directory) of every
  checkpoint restore from now on."""
  steps, restore = [], checkpoint.Slot.restore

  def record(self, carry_like):
    restored = restore(self, carry_like)
    left = sorted(os.listdir(self.directory)) if os.path.isdir(self.directory) else []
    steps.append((None if restored is None else restored[0], left))
    return restored

  monkeypatch.setattr(checkpoint.Slot, "restore", record)
  return steps


def stop_after_round(out, rounds, monkeypatch, capfd) -> None:
  """Runs ARGS in `out`, checkpointing every round and stopped (as by SIGTERM) after
  `rounds` rounds: the checkpoint of round `rounds` is saved."""
  asked = iter([None] * (rounds - 1))
  monkeypatch.setattr(checkpoint.Signals, "requested", lambda self: next(asked, "SIGTERM"))
  assert cli.main(["run", *ARGS, "--out", out, "--checkpoint-every", "1"]) == 143
  monkeypatch.undo()
  capfd.readouterr()
  assert os.listdir(checkpoints(out)) == [str(rounds)]


def test_a_directory_in_use_is_refused_naming_its_holder_until_a_sigkill_frees_it(
    tmp_path, capfd, reference):
  """A run in another process holds --out: a second run there (of the same configuration or
  another), --resume, --from-config, --overwrite and run_to_dir are refused (exit 2, one
  line naming the holder's process id) and write nothing; once the holder is killed
  (SIGKILL) the directory is free."""
  out = str(tmp_path / "run")
  held = [*SMALL, "--set", "rounds=1000000", "--checkpoint-every", "100"]
  holder = run_cli([*held, "--out", out])
  try:
    wait_for_checkpoint(out, holder)
    before = snapshot(out, skip="parts")
    for command in (["run", "--resume", out], ["run", *held, "--out", out],
                    ["run", "--from-config", os.path.join(out, "config.json"), "--out", out],
                    ["run", *ARGS, "--out", out],
                    ["run", *ARGS, "--out", out, "--overwrite"]):
      assert cli.main([*command, "--no-progress"]) == 2, command
      error = one_line(capfd.readouterr().err)
      assert error == (f"fedjax-rep: error: run directory {out} is in use by process "
                       f"{holder.pid} (a fedjax-rep run holds {out}/.lock); wait for it to "
                       f"end, or choose another --out"), command
    with pytest.raises(outputs.InUse, match=f"in use by process {holder.pid} "):
      runner.run_to_dir("fedrep-fig3", quick=True, out=out, overwrite=True, progress=False)
    assert holder.poll() is None, "the holder ended before the refusals were tested"
    assert snapshot(out, skip="parts") == before
  finally:
    holder.kill()
    holder.communicate()
  assert cli.main(["run", *ARGS, "--out", out, "--overwrite"]) == 0
  assert metrics_text(out) == reference


def test_a_lock_of_this_process_is_refused_too_and_freed_when_run_to_dir_returns(tmp_path):
  out = str(tmp_path / "run")
  os.makedirs(out)
  fd = outputs.lock(out)
  with open(os.path.join(out, ".lock")) as f:
    assert f.read() == f"{os.getpid()}\n"
  with pytest.raises(outputs.InUse, match=f"in use by process {os.getpid()} "):
    outputs.lock(out)
  small = dict(seeds=2, overrides=["num_clients=10,20", "samples_per_client=4", "rounds=2"],
               out=out, progress=False)
  with pytest.raises(outputs.InUse):
    runner.run_to_dir("fedrep-fig3", **small)
  assert os.listdir(out) == [".lock"]  # refused: nothing written
  os.close(fd)
  runner.run_to_dir("fedrep-fig3", **small)
  os.close(outputs.lock(out))  # free again


def test_resume_of_a_complete_run_says_so_and_writes_nothing(tmp_path, capfd, reference):
  out = str(tmp_path / "run")
  assert cli.main(["run", *ARGS, "--out", out]) == 0
  capfd.readouterr()
  before = snapshot(out)
  assert cli.main(["run", "--resume", out, "--no-progress"]) == 0
  captured = capfd.readouterr()
  assert captured.err == ""
  assert one_line(captured.out) == (
      f"fedjax-rep: {out} holds a complete run (config.json, metrics.csv, fedrep-fig3.png): "
      f"nothing to resume, nothing written; to run it again: fedjax-rep run --from-config "
      f"{out}/config.json --out NEW")
  assert snapshot(out) == before
  fd = outputs.lock(out)  # held (here by this process): refused, as any directory in use
  assert cli.main(["run", "--resume", out]) == 2
  assert f"{out} is in use by process {os.getpid()} " in one_line(capfd.readouterr().err)
  os.close(fd)
  os.unlink(os.path.join(out, "metrics.csv"))  # not complete: --resume writes it again
  assert cli.main(["run", "--resume", out, "--no-progress"]) == 0
  assert metrics_text(out) == reference


def test_a_full_disk_while_writing_metrics_csv_stops_in_one_line_then_resume_finishes(
    tmp_path, capfd, monkeypatch, reference):
  out = str(tmp_path / "run")
  write = outputs.RunDir.write

  def full_disk(self, name, write_file):
    if name == "metrics.csv":
      def write_file(f):  # the first bytes, then the disk is full
        f.write(b"algorithm,")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    write(self, name, write_file)

  monkeypatch.setattr(outputs.RunDir, "write", full_disk)
  assert cli.main(["run", *ARGS, "--out", out]) == cli.WRITE_FAILED
  assert one_line(capfd.readouterr().err) == (
      f"fedjax-rep: error: cannot write {out}/metrics.csv (No space left on device); what ran "
      f"before is saved in {out}: once it can be written (e.g. with free space), resume "
      f"with `fedjax-rep run --resume {out}`")
  assert sorted(os.listdir(out)) == [".lock", "config.json", "parts"]  # no half file
  assert os.listdir(os.path.join(out, "parts")) == ["n10-20.npz"]
  monkeypatch.undo()
  assert cli.main(["run", "--resume", out, "--no-progress"]) == 0
  assert metrics_text(out) == reference


def test_a_full_disk_while_saving_a_checkpoint_keeps_the_one_before(
    tmp_path, capfd, monkeypatch, reference):
  """The save of round 2 fails in orbax's writer (its temporary directory is left half
  written): one line, exit 74; the resume restores round 1 and deletes the rest."""
  out = str(tmp_path / "run")
  save, calls = ocp.handlers.JsonCheckpointHandler._save_fn, []

  async def full_disk(self, x, directory):
    calls.append(directory)
    if len(calls) == 2:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return await save(self, x, directory)

  monkeypatch.setattr(ocp.handlers.JsonCheckpointHandler, "_save_fn", full_disk)
  assert cli.main(["run", *ARGS, "--out", out, "--checkpoint-every", "1"]) == cli.WRITE_FAILED
  assert one_line(capfd.readouterr().err).startswith(
      f"fedjax-rep: error: cannot write {checkpoints(out)}/2 (No space left on device); ")
  assert not os.path.exists(os.path.join(out, "metrics.csv"))
  assert sorted(os.listdir(checkpoints(out))) == ["1", "2.orbax-checkpoint-tmp"]
  monkeypatch.undo()
  steps = restored_steps(monkeypatch)
  assert cli.main(["run", "--resume", out, "--no-progress"]) == 0
  assert steps == [(1, ["1"])]  # the half-written round 2 deleted
  assert metrics_text(out) == reference
  assert capfd.readouterr().err == ""
  assert os.listdir(os.path.join(out, "parts")) == ["n10-20.npz"]


REFUSED_SAVE = """
import resource, signal, sys
import numpy as np
from fedjax_rep.core import checkpoint, files
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
slot = checkpoint.Slot(sys.argv[1], None, None)
slot.save(1, {"a": np.arange(4.0)}, {"loss": np.arange(1.0)}, {"eval_rounds": []})
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
try:
  slot.save(2, {"a": np.random.default_rng(0).random(1 << 20)}, {"loss": np.arange(2.0)},
            {"eval_rounds": []})
except files.WriteError as error:
  print(error)
"""


def test_a_checkpoint_write_that_the_system_refuses_keeps_the_one_before(tmp_path):
  """A real write failure inside orbax's array writer (tensorstore), as a full disk gives:
  a file size limit (EFBIG) in a child process. WriteError names the step; the step before
  is restored, and the half-written one deleted."""
  directory = str(tmp_path / "run0")
  done = subprocess.run([sys.executable, "-c", REFUSED_SAVE, directory], capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout == f"cannot write {directory}/2 (File too large)\n"
  step, carry, _, _ = checkpoint.Slot(directory, None, None).restore({"a": np.zeros(4)})
  assert step == 1 and carry["a"].tolist() == [0, 1, 2, 3]
  assert os.listdir(directory) == ["1"]


def damage(path: str, how: str) -> None:
  """Truncates every file under `path` (a file or a directory) to half its size, or
  ("garbled") inverts 16 bytes a third of the way into each of its files."""
  paths = [path] if os.path.isfile(path) else [
      p for p in glob.glob(os.path.join(path, "**", "*"), recursive=True) if os.path.isfile(p)]
  for p in paths:
    with open(p, "r+b") as f:
      data = f.read()
      if how == "truncated":
        f.truncate(len(data) // 2)
      else:
        at = len(data) // 3
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in data[at:at + 16]))


@pytest.mark.parametrize("how", ["truncated", "garbled"])
def test_a_damaged_checkpoint_is_named_and_the_unit_runs_again(
    tmp_path, capfd, monkeypatch, reference, how):
  out = str(tmp_path / "run")
  stop_after_round(out, 3, monkeypatch, capfd)
  step = os.path.join(checkpoints(out), "3")
  damage(step, how)
  steps = restored_steps(monkeypatch)
  assert cli.main(["run", "--resume", out, "--no-progress"]) == 0
  assert steps == [(None, [])]  # the damaged one deleted: the unit ran from its start
  line = one_line(capfd.readouterr().err)
  assert line.startswith(f"fedjax-rep: checkpoint {step} cannot be read (")
  assert line.endswith("): deleted; going on from the start of its run")
  assert metrics_text(out) == reference


def test_a_checkpoint_that_records_another_run_is_refused_in_one_line(
    tmp_path, capfd, monkeypatch, reference):
  """A checkpoint whose recorded identity is not the one its run computes (here its rounds
  edited): --resume exits 2 with one line naming it and what differs, and keeps it; once it
  is deleted, as the line says, the run ends as one never stopped."""
  out = str(tmp_path / "run")
  stop_after_round(out, 2, monkeypatch, capfd)
  directory = checkpoints(out)
  meta = os.path.join(directory, "2", "meta", "metadata")
  with open(meta) as f:
    text = f.read()
  with open(meta, "w") as f:
    f.write(text.replace('"rounds": [0, 6]', '"rounds": [0, 7]'))
  assert cli.main(["run", "--resume", out, "--no-progress"]) == 2
  assert one_line(capfd.readouterr().err) == (
      f"fedjax-rep: error: checkpoint {directory}/2 holds another run (its rounds differ from "
      f"this call's): delete {directory} to run this call from its start, or start the whole "
      f"run over (--overwrite)")
  assert os.listdir(directory) == ["2"]
  shutil.rmtree(directory)
  assert cli.main(["run", "--resume", out, "--no-progress"]) == 0
  assert metrics_text(out) == reference


def test_a_damaged_checkpoint_falls_back_to_the_one_before(tmp_path, capfd):
  """Where an earlier step is left (a run keeps its latest only: here a copy put back),
  a damaged latest step is named, deleted, and the one before restored."""
  directory = str(tmp_path / "run0")
  slot = checkpoint.Slot(directory, None, None)
  slot.save(1, {"a": np.arange(4.0)}, {"loss": np.arange(1.0)}, {"eval_rounds": []})
  shutil.copytree(os.path.join(directory, "1"), str(tmp_path / "copy"))
  slot.save(2, {"a": np.arange(4.0) + 1}, {"loss": np.arange(2.0)}, {"eval_rounds": []})
  shutil.copytree(str(tmp_path / "copy"), os.path.join(directory, "1"))
  damage(os.path.join(directory, "2"), "truncated")
  step, carry, history, _ = checkpoint.Slot(directory, None, None).restore({"a": np.zeros(4)})
  assert step == 1 and carry["a"].tolist() == [0, 1, 2, 3] and len(history["loss"]) == 1
  line = one_line(capfd.readouterr().err)
  assert line.startswith(f"fedjax-rep: checkpoint {directory}/2 cannot be read (")
  assert line.endswith("): deleted; going on from round 1")
  assert os.listdir(directory) == ["1"]


def test_a_damaged_unit_is_named_and_computed_again(tmp_path, capfd, reference):
  out = str(tmp_path / "run")
  assert cli.main(["run", *ARGS, "--out", out]) == 0
  unit = os.path.join(out, "parts", "n10-20.npz")
  damage(unit, "truncated")
  os.unlink(os.path.join(out, "metrics.csv"))
  capfd.readouterr()
  assert cli.main(["run", "--resume", out, "--no-progress"]) == 0
  assert one_line(capfd.readouterr().err).startswith(f"fedjax-rep: {unit} cannot be read (")
  assert metrics_text(out) == reference


SLOW_SAVE = """
import sys, time
import orbax.checkpoint as ocp
from fedjax_rep import cli
save, calls = ocp.handlers.JsonCheckpointHandler._save_fn, []
async def slow(self, x, directory):
  calls.append(directory)
  if len(calls) == 2:
    time.sleep(600)  # the test kills the process here, in the middle of the save of round 2
  return await save(self, x, directory)
ocp.handlers.JsonCheckpointHandler._save_fn = slow
sys.exit(cli.main(["run", *sys.argv[1:]]))
"""


def test_sigkill_in_the_middle_of_a_checkpoint_save_then_resume_is_byte_identical(
    tmp_path, monkeypatch, reference):
  out = str(tmp_path / "run")
  process = subprocess.Popen(
      [sys.executable, "-c", SLOW_SAVE, *ARGS, "--out", out, "--checkpoint-every", "1"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 120
  while not glob.glob(os.path.join(out, CHECKPOINTS, "2.orbax-checkpoint-tmp*")):
    assert process.poll() is None, process.communicate()
    assert time.monotonic() < deadline, "the save of round 2 did not start"
    time.sleep(0.02)
  time.sleep(0.5)
  process.kill()
  process.communicate()
  assert sorted(os.listdir(checkpoints(out))) == ["1", "2.orbax-checkpoint-tmp"]
  steps = restored_steps(monkeypatch)
  assert cli.main(["run", "--resume", out, "--no-progress"]) == 0
  assert steps == [(1, ["1"])]  # the half-written round 2 deleted
  assert metrics_text(out) == reference
