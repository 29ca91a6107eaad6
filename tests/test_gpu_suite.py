"""benchmarks/gpu_suite.py: its --toy run writes a row of every part with finite, positive
numbers (FedRep's parts in float32 and in bf16), and only the parts `--parts` names; its mock
CIFAR clients hold S classes each; its client group is the CPU default on the CPU and what half
the free memory holds on an accelerator."""

import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from fedjax_rep.nn.hparams import hparams
from fedjax_rep.nn.models import make_model
from fedjax_rep.nn.algorithms import make_algorithm
from conftest import BENCHMARKS, benchmark_module

CPU_NONE = {"peak_device_bytes", "client_bytes"}  # not measured on the CPU


@pytest.fixture(scope="module")
def gpu_suite():
  """The benchmark script as a module (it imports its neighbours nn_round and linear_round)."""
  return benchmark_module("gpu_suite")


def numbers(row):
  """(name, value) of every number of `row`, list entries included (bools and text not)."""
  for name, value in row.items():
    for v in value if isinstance(value, list) else [value]:
      if isinstance(v, (int, float)) and not isinstance(v, bool):
        yield name, v


@pytest.mark.slow
def test_the_toy_suite_writes_every_part_with_finite_positive_numbers(tmp_path):
  path = tmp_path / "rows.json"
  run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "gpu_suite.py"), "--toy",
                        "--precision", "float32", "bf16", "--json", str(path)], check=True,
                       capture_output=True, text=True, timeout=600)
  report = json.loads(path.read_text())
  rows = report["rows"]
  assert report["toy"] and any(line.startswith("jax devices") for line in report["machine"])
  assert [r["part"] for r in rows[:3]] == ["matmul", "e2e", "round"]
  assert [(r["part"], r["precision"]) for r in rows[1:5]] == [
      ("e2e", "float32"), ("round", "float32"), ("e2e", "bf16"), ("round", "bf16")]
  assert "bf16 over float32, seconds per round: e2e " in run.stdout
  cohort = rows[5:]
  assert {r["part"] for r in cohort} == {"cohort"}
  assert [r["implementation"] for r in cohort].count("loop") == 1
  vmap_groups = [r["group"] for r in cohort if r["implementation"] == "vmap"]
  assert len(set(vmap_groups)) == len(vmap_groups) >= 2
  assert [r["group"] for r in cohort if r["auto"]] == [4]  # the CPU default 10, the cohort 4
  for r in rows:
    for name, value in numbers(r):
      assert math.isfinite(value) and (value >= 0 if name == "load1" else value > 0), (
          r["part"], name, value)
    nones = {name for name, value in r.items() if value is None}
    assert nones <= CPU_NONE | ({"group"} if r.get("implementation") == "loop" else set())
  e2e = rows[1]
  assert e2e["total_seconds"] == pytest.approx(e2e["rounds"] * e2e["seconds_per_round"])
  assert e2e["first_call_seconds"] > e2e["compile_seconds"]


@pytest.mark.slow
def test_parts_runs_only_the_parts_named(tmp_path):
  path = tmp_path / "rows.json"
  run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "gpu_suite.py"), "--toy",
                        "--parts", "cohort", "--json", str(path)], check=True,
                       capture_output=True, text=True, timeout=600)
  rows = json.loads(path.read_text())["rows"]
  assert rows[0]["part"] == "matmul" and {r["part"] for r in rows[1:]} == {"cohort"}
  assert "FedRep on mock" not in run.stdout and "FedAvg round, 4 clients" in run.stdout


def test_mock_cifar_clients_hold_their_own_classes(gpu_suite):
  data = gpu_suite.cifar_data(0, 6, 2, 40, 7)
  assert data.x.shape == (6, 40, 32, 32, 3) and data.x_test.shape == (6, 7, 32, 32, 3)
  assert np.all(np.asarray(data.counts) == 40) and np.all(np.asarray(data.test_counts) == 7)
  data.check()
  for y, y_test in zip(np.asarray(data.y), np.asarray(data.y_test)):
    assert len(set(y)) == 2 and set(y_test) <= set(y)


def test_on_the_cpu_the_group_is_the_project_default(gpu_suite):
  data = gpu_suite.synthetic_data(jax.random.key(0), 30, 5, (28, 28, 1))
  model = make_model("mlp", 10)
  for cohort, group in ((30, 10), (4, 4)):
    alg = make_algorithm("fedavg", model=model, cohort=cohort)
    assert gpu_suite.client_group(alg, data, hparams()) == (group, None)


@pytest.mark.slow  # the fast tier keeps the suite's other checks of its tables
def test_on_an_accelerator_the_group_is_what_half_the_free_memory_holds(gpu_suite,
                                                                        monkeypatch):
  monkeypatch.setattr(gpu_suite, "accelerator", lambda: True)
  monkeypatch.setattr(gpu_suite.memory, "available_bytes", lambda: 1 << 40)
  data = gpu_suite.synthetic_data(jax.random.key(0), 8, 30, (28, 28, 1))
  alg = make_algorithm("fedavg", model=make_model("mlp", 10), cohort=8, client_group=None)
  group, per_client = gpu_suite.client_group(alg, data, hparams())
  shared = alg.init(jax.random.key(0), data, hparams()).shared
  params = sum(p.size for p in jax.tree.leaves(shared))
  assert group == 8  # 2^39 bytes hold them all
  assert per_client > 4 * (data.x[0].size + 3 * params)  # its data; params in, out, gradients
  monkeypatch.setattr(gpu_suite, "client_bytes", lambda *args: per_client)
  for free, expected in ((5 * per_client, 2), (per_client, 1), (17 * per_client, 8)):
    monkeypatch.setattr(gpu_suite.memory, "available_bytes", lambda: free)
    assert gpu_suite.client_group(alg, data, hparams()) == (expected, per_client)
