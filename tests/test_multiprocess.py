"""Jobs of several real processes on this machine (`fedjax_rep.core.distributed`, gloo
collectives over loopback): the sharded linear round (2 and 4 processes), the neural round
and a recipe through the command line give the numbers of one process with the same
cohort groups; a job that loses a process stops, and `--resume` finishes it."""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from fedjax_rep import cli
from fedjax_rep.experiments import outputs
from conftest import Job, emulated_devices_env

pytestmark = pytest.mark.slow  # real processes: each job compiles its own programs

JOB_TIMEOUT = 300  # seconds for a job to finish
RESULT = "RESULT "  # prefix of the line with process 0's metrics
NO_GLOO = re.compile(r".*gloo.*(not (available|supported|implemented)|unimplemented).*", re.I)

LINEAR = """
from fedjax_rep.core import distributed
distributed.join()
import json, jax, jax.numpy as jnp, numpy as np
import fedjax_rep as fr
problem = fr.make_problem(jax.random.key(0), num_clients=64, dim=10, rep_dim=2, noise_std=0.03)
data = fr.make_fixed_data(jax.random.key(1), problem, samples=5)
hp = fr.LinearHparams(lr=jnp.float32(0.1), head_lr=jnp.float32(0.1))
devices = len(jax.devices())
algorithm = fr.FedRep(rep_dim=2, cohort=16, devices=None if devices == 1 else devices,
                      client_groups=8)
result = fr.run(algorithm, data, hp, jax.random.key(2), 20, progress=False)
if jax.process_index() == 0:
  print("RESULT " + json.dumps({k: np.asarray(v).tolist() for k, v in result.metrics.items()}))
"""

NEURAL = """
from fedjax_rep.core import distributed
distributed.join()
import json, jax, numpy as np
import fedjax_rep as fr
from fedjax_rep.core import sharding
data = jax.tree.map(lambda a: a[:16], fr.digits.federated(40, "classes", 2, seed=0))
devices = len(jax.devices())
algorithm = fr.make_neural_algorithm(
    "fedrep", model=fr.make_model("digits-mlp", 10), cohort=8, local_epochs=1, head_epochs=2,
    batch_size=4, client_group=2, cohort_groups=8, devices=None if devices == 1 else devices)
if devices > 1:
  data = sharding.shard_clients(data, sharding.client_mesh(devices))
result = fr.run(algorithm, data, fr.nn_hparams(lr=0.1, momentum=0.5, weight_decay=1e-3),
                jax.random.key(0), 3, progress=False)
if jax.process_index() == 0:
  print("RESULT " + json.dumps({**{k: np.asarray(v).tolist() for k, v in result.metrics.items()},
                                **{k: np.asarray(v).tolist()
                                   for k, v in result.eval_metrics.items()}}))
"""

# README's commands (one device, then a job with devices=all)
FIG3 = ["run", "fedrep-fig3", "--quick", "--set", "num_clients=800", "--set", "cohort_groups=8",
        "--no-progress"]


def assert_succeeded(job, timeout=JOB_TIMEOUT) -> None:
  """Every process of `job` ends with code 0 (the test skips where the platform has no
  gloo CPU collectives: a job cannot run there)."""
  codes = job.wait(timeout)
  for i, code in enumerate(codes):
    if code and NO_GLOO.search(job.log(i)):
      pytest.skip(f"gloo CPU collectives cannot run here: {NO_GLOO.search(job.log(i))[0]}")
    assert code == 0, f"process {i} of the job failed ({code}):\n{job.log(i)}"


def job_result(job, timeout=JOB_TIMEOUT) -> dict:
  """Process 0's RESULT line of a job whose processes all succeed."""
  assert_succeeded(job, timeout)
  lines = [line for line in job.log(0, last=None).splitlines() if line.startswith(RESULT)]
  assert lines, job.log(0)
  return json.loads(lines[-1][len(RESULT):])


def one_process(code, tmp_path) -> dict:
  """The RESULT of `code` run as a job of one process with one device."""
  folder = tmp_path / "one"
  folder.mkdir()
  with Job([sys.executable, "-c", code], 1, 1, str(folder)) as job:
    return job_result(job)


def assert_same(got: dict, expected: dict):
  assert got.keys() == expected.keys()
  for name in expected:
    np.testing.assert_allclose(got[name], expected[name], rtol=2e-4, atol=1e-6, err_msg=name)


def rows(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def assert_same_csv(path, expected_path):
  """Two metrics.csv files: the same rows and columns, numbers equal to float32 round-off
  (empty cells, e.g. test accuracy between evaluations, in the same places)."""
  got, expected = rows(path), rows(expected_path)
  assert [(r.keys(), r["algorithm"]) for r in got] == [(r.keys(), r["algorithm"])
                                                       for r in expected]
  column = lambda table, k: [float(r[k]) if r[k] else np.nan for r in table]
  assert_same({k: column(got, k) for k in got[0] if k != "algorithm"},
              {k: column(expected, k) for k in expected[0] if k != "algorithm"})


@pytest.mark.parametrize("processes,devices", [(2, 2), (4, 1)])
def test_linear_round_across_processes(processes, devices, tmp_path):
  with Job([sys.executable, "-c", LINEAR], processes, devices, str(tmp_path)) as job:
    assert_same(job_result(job), one_process(LINEAR, tmp_path))


def test_neural_round_across_processes(tmp_path):
  with Job([sys.executable, "-c", NEURAL], 2, 2, str(tmp_path)) as job:
    assert_same(job_result(job), one_process(NEURAL, tmp_path))


@pytest.fixture(scope="module")
def fig3_one_device(tmp_path_factory):
  """fedrep-fig3's metrics.csv from one process on one device, same cohort groups."""
  out = str(tmp_path_factory.mktemp("fig3") / "one")
  assert cli.main([*FIG3, "--out", out]) == 0
  return os.path.join(out, "metrics.csv")


def test_recipe_as_a_job_of_two_processes(fig3_one_device, tmp_path):
  command = [sys.executable, "-m", "fedjax_rep", *FIG3, "--set", "devices=all", "--out", "out"]
  with Job(command, 2, 4, str(tmp_path)) as job:
    assert_succeeded(job)
  assert_same_csv(tmp_path / "out" / "metrics.csv", fig3_one_device)
  with open(tmp_path / "out" / "config.json") as f:
    assert json.load(f)["job"] == {"processes": 2, "devices": 8}
  assert "wrote" in job.log(0) and "wrote" not in job.log(1)  # process 0 writes


@pytest.mark.parametrize("recipe,settings,devices", [
    ("fedrep-fig3", [], 8),
    ("digits-personalized", ["algorithms=fedrep,fedavg-ft", "rounds=10", "cohort_groups=5"], 5),
])
def test_recipe_on_emulated_devices(recipe, settings, devices, fig3_one_device, tmp_path):
  """One process, `devices` emulated devices, devices=all: the metrics of one device."""
  if recipe == "fedrep-fig3":
    command, expected = FIG3, fig3_one_device
  else:
    command = ["run", recipe, "--quick", "--no-progress",
               *[a for item in settings for a in ("--set", item)]]
    expected = str(tmp_path / "one" / "metrics.csv")
    assert cli.main([*command, "--out", str(tmp_path / "one")]) == 0
  run = subprocess.run([sys.executable, "-m", "fedjax_rep", *command, "--set", "devices=all",
                        "--out", str(tmp_path / "sharded")], env=emulated_devices_env(devices),
                       capture_output=True, text=True, timeout=JOB_TIMEOUT)
  assert run.returncode == 0, run.stderr[-3000:]
  assert_same_csv(tmp_path / "sharded" / "metrics.csv", expected)
  with open(tmp_path / "sharded" / "config.json") as f:
    assert json.load(f)["job"] == {"processes": 1, "devices": devices}


def test_a_job_that_loses_a_process_stops_and_resumes(fig3_one_device, tmp_path):
  heartbeat = {"FEDJAX_REP_HEARTBEAT_SECONDS": "5"}
  command = [sys.executable, "-m", "fedjax_rep", *FIG3, "--set", "devices=all", "--out", "out",
             "--checkpoint-every", "5"]
  with Job(command, 2, 2, str(tmp_path), env=heartbeat) as job:
    parts = tmp_path / "out" / "parts"  # n800-settings0-0.ckpt/fedrep-HASH/ROUND, ... inside
    deadline = time.monotonic() + JOB_TIMEOUT
    while not any(p.name.isdigit() for p in parts.glob("n800*.ckpt/fedrep-*/*")):
      assert time.monotonic() < deadline and job.processes[0].poll() is None, job.log(0)
      time.sleep(0.2)
    job.processes[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    codes = job.wait(60)
    assert codes[0] == 1 and time.monotonic() - killed < 60, job.log(0)
    # One line from the job's process 0 (gloo's connection notes aside), no runtime report.
    lines = [line for line in job.log(0, last=None).splitlines()
             if line and not line.startswith("[Gloo]")]
    assert len(lines) == 1 and lines[0].startswith("fedjax-rep: error: process 0 of the job"), lines
    assert "fedjax-rep run --resume out" in lines[0]
  resume = [sys.executable, "-m", "fedjax_rep", "run", "--resume", "out", "--no-progress"]
  with Job(resume, 2, 2, str(tmp_path), name="resume") as job:
    assert job.wait(JOB_TIMEOUT) == [0, 0], job.log(0) + job.log(1)
  assert_same_csv(tmp_path / "out" / "metrics.csv", fig3_one_device)
  with Job(resume, 2, 2, str(tmp_path), name="complete") as job:  # nothing left to resume
    assert job.wait(JOB_TIMEOUT) == [0, 0], job.log(0) + job.log(1)
    said = [[line for line in job.log(i, last=None).splitlines()
             if line and not line.startswith("[Gloo]")] for i in (0, 1)]
    assert len(said[0]) == 1 and said[0][0].startswith("fedjax-rep: out holds a complete run")
    assert said[1] == [], said[1]


def test_a_job_on_a_directory_in_use_stops_on_every_process(tmp_path):
  """Process 0 takes the lock of --out: held by another process (this one), every process
  of the job exits 2, process 0 naming the holder."""
  os.makedirs(tmp_path / "out")
  fd = outputs.lock(str(tmp_path / "out"))
  try:
    with Job([sys.executable, "-m", "fedjax_rep", *FIG3, "--out", "out"], 2, 1,
             str(tmp_path)) as job:
      codes = job.wait(JOB_TIMEOUT)
      if codes != [2, 2] and NO_GLOO.search(job.log(0)):
        pytest.skip("gloo CPU collectives cannot run here")
      assert codes == [2, 2], job.log(0) + job.log(1)
      assert job.log(0).strip().endswith(f"fedjax-rep: error: run directory out is in use by "
                                         f"process {os.getpid()} (a fedjax-rep run holds "
                                         f"out/.lock); wait for it to end, or choose another "
                                         f"--out")
      assert job.log(1).strip().endswith("fedjax-rep: error: --out out was refused by another "
                                         "process of the job (its line says why)")
  finally:
    os.close(fd)
  assert os.listdir(tmp_path / "out") == [".lock"]
