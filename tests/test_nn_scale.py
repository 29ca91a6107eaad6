"""benchmarks/nn_scale.py: its memory estimates are those of synthetic.federated's padded
layout and of the raw data; its --quick run writes one row per n with the issue's keys, the
per-client loop agreeing with today's engine on the averaged body; an engine over the
memory limit is skipped with its estimate, the loop still measured."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_rep.data import synthetic
from conftest import BENCHMARKS, benchmark_module

KEYS = {"n", "seconds_per_round", "loop_seconds_per_round", "peak_rss_bytes",
        "raw_data_bytes", "padded_data_bytes", "max_size", "mean_size", "loop_compiles",
        "loop_peak_rss_bytes", "loop_relative_error"}


@pytest.fixture(scope="module")
def nn_scale():
  return benchmark_module("nn_scale")


def run(tmp_path, *args):
  """The rows the script writes with `args`."""
  path = tmp_path / "rows.json"
  subprocess.run([sys.executable, os.path.join(BENCHMARKS, "nn_scale.py"), *args, "--json",
                  str(path)], check=True, capture_output=True, text=True, timeout=600)
  return json.loads(path.read_text())


def test_the_estimates_are_the_padded_layout_and_the_raw_data(nn_scale):
  n, seed = 30, 4
  data = synthetic.federated(1.0, 1.0, n, seed, test_fraction=nn_scale.TEST_FRACTION)
  raw = synthetic.generate(1.0, 1.0, n, seed)
  estimates = nn_scale.memory_estimates(n, seed)
  row = nn_scale.ROW_BYTES
  assert estimates["padded_data_bytes"] == (data.x.size + data.x_test.size) * 4 + (
      data.y.size + data.y_test.size) * 4
  assert estimates["raw_data_bytes"] == sum(x.nbytes + y.nbytes for x, y in
                                            zip(raw["x"], raw["y"]))
  assert estimates["raw_data_bytes"] == row * (int(np.sum(data.counts))
                                               + int(np.sum(data.test_counts)))
  assert estimates["max_size"] == max(len(y) for y in raw["y"])
  train_rows, test_rows = nn_scale.client_sizes(n, seed)
  np.testing.assert_array_equal(train_rows, data.counts)
  np.testing.assert_array_equal(test_rows, data.test_counts)


def test_the_loop_pads_to_powers_of_two(nn_scale):
  assert [nn_scale.pad_size(m) for m in (1, 50, 64, 65, 128, 129, 3000)] == [
      64, 64, 64, 128, 128, 256, 4096]


@pytest.mark.slow
def test_the_quick_run_writes_rows_and_the_loop_matches_the_engine(tmp_path):
  rows = run(tmp_path, "--quick")
  assert [r["n"] for r in rows] == [100, 200]
  for r in rows:
    assert KEYS <= set(r), KEYS - set(r)
    assert "skipped" not in r and "error" not in r and r["loop_error"] is None
    assert r["seconds_per_round"] > 0 and r["loop_seconds_per_round"] > 0
    assert r["peak_rss_bytes"] > r["raw_data_bytes"] > 0
    assert r["padded_data_bytes"] > r["raw_data_bytes"]
    assert 1 <= r["loop_compiles"] == len(r["loop_padded_sizes"])
    # the loop runs only real steps, the engine every client for the largest one's
    assert r["loop_steps_per_round"] < r["engine_steps_per_round"]
    assert r["loop_relative_error"] < 1e-5 and r["loop_update_relative_error"] < 1e-4


@pytest.mark.slow
def test_an_engine_over_the_memory_limit_is_skipped(tmp_path):
  [r] = run(tmp_path, "--clients", "100", "--rounds", "1", "--memory-limit-gb", "0.001")
  assert r["seconds_per_round"] is None and r["peak_rss_bytes"] is None
  assert "GiB > limit" in r["skipped"] and r["loop_relative_error"] is None
  assert r["loop_seconds_per_round"] > 0 and r["loop_peak_rss_bytes"] > 0
