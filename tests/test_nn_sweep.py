"""benchmarks/nn_sweep.py: its settings are distinct (lr, momentum) pairs (the recipe's for
one), its comparison of the two variants' final metrics is NaN-aware and asserts, and a
tiny run writes one row per grid size with the issue's keys, the two variants agreeing."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BENCHMARKS, benchmark_module

KEYS = {"settings", "seeds", "rounds", "seconds_one_program", "seconds_one_at_a_time", "ratio",
        "compile_seconds_one_program", "compile_seconds_one_at_a_time", "peak_rss_bytes",
        "peak_rss_bytes_one_at_a_time", "max_abs_diff", "load", "backend"}


@pytest.fixture(scope="module")
def nn_sweep():
  return benchmark_module("nn_sweep")


def test_settings_are_distinct_pairs(nn_sweep):
  assert nn_sweep.settings(1) == [(0.05, 0.5)]
  pairs = nn_sweep.settings(8)
  assert len(set(pairs)) == 8
  lrs = [lr for lr, _ in pairs]
  assert lrs[0] == pytest.approx(0.01) and lrs[-1] == pytest.approx(0.1)
  assert all(0 <= momentum < 1 for _, momentum in pairs)


def test_max_abs_diff_is_nan_aware_and_asserts(nn_sweep):
  a = {"train_loss": np.array([1.0, np.nan]), "eval:test_accuracy": np.array([0.5, 0.25])}
  b = {"train_loss": np.array([1.0 + 1e-6, np.nan]), "eval:test_accuracy": np.array([0.5, 0.25])}
  assert nn_sweep.max_abs_diff(a, b) == pytest.approx(1e-6)
  with pytest.raises(AssertionError):
    nn_sweep.max_abs_diff(a, {**b, "eval:test_accuracy": np.array([0.5, 0.3])})
  with pytest.raises(AssertionError):
    nn_sweep.max_abs_diff(a, {**b, "train_loss": np.array([1.0, 2.0])})


@pytest.mark.slow
def test_a_tiny_run_writes_a_row_per_grid_size(tmp_path):
  path = tmp_path / "rows.json"
  subprocess.run([sys.executable, os.path.join(BENCHMARKS, "nn_sweep.py"), "--settings", "1",
                  "2", "--seeds", "1", "--rounds", "2", "--clients", "20", "--eval-every", "1",
                  "--repeats", "1", "--json", str(path)],
                 check=True, capture_output=True, text=True, timeout=900)
  rows = json.loads(path.read_text())
  assert [(r["settings"], r["seeds"], r["rounds"]) for r in rows] == [(1, 1, 2), (2, 1, 2)]
  for r in rows:
    assert KEYS <= set(r), KEYS - set(r)
    assert not any(key.startswith("error") for key in r)
    assert r["seconds_one_program"] > 0 and r["seconds_one_at_a_time"] > 0
    assert r["ratio"] == pytest.approx(r["seconds_one_program"] / r["seconds_one_at_a_time"])
    assert r["compile_seconds_one_program"] > 0 and r["compile_seconds_one_at_a_time"] > 0
    assert r["peak_rss_bytes"] >= r["setup_rss_bytes_one_program"] > 0
    assert r["peak_rss_bytes_one_at_a_time"] >= r["setup_rss_bytes_one_at_a_time"] > 0
    assert 0 <= r["max_abs_diff"] < 1e-4
    assert len(r["load"]) == 3 and r["backend"] in ("cpu", "gpu", "tpu")
    assert len(r["lrs_momenta"]) == r["settings"]
