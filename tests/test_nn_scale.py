"""benchmarks/nn_scale.py: its sizes and memory estimates are those of the data it builds
(Synthetic's as synthetic.federated's); its --quick run writes one row per federation and n
with the issue's keys, the per-client loop agreeing with the engine on the averaged body."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_rep.data import synthetic
from conftest import BENCHMARKS, benchmark_module

KEYS = {"data", "n", "seconds_per_round", "loop_seconds_per_round", "peak_rss_bytes",
        "raw_data_bytes", "padded_data_bytes", "max_size", "mean_size", "loop_compiles",
        "loop_peak_rss_bytes", "loop_relative_error", "engine_size_classes"}


@pytest.fixture(scope="module")
def nn_scale():
  return benchmark_module("nn_scale")


def run(tmp_path, *args):
  """The rows the script writes with `args`."""
  path = tmp_path / "rows.json"
  subprocess.run([sys.executable, os.path.join(BENCHMARKS, "nn_scale.py"), *args, "--json",
                  str(path)], check=True, capture_output=True, text=True, timeout=900)
  return json.loads(path.read_text())


def test_synthetic_sizes_and_estimates_are_the_datas(nn_scale):
  n, seed = 30, 4
  federation = nn_scale.FEDERATIONS["synthetic"]
  data = synthetic.federated(1.0, 1.0, n, seed, test_fraction=nn_scale.SYNTHETIC_TEST_FRACTION)
  padded = synthetic.federated(1.0, 1.0, n, seed, layout="padded",
                               test_fraction=nn_scale.SYNTHETIC_TEST_FRACTION)
  estimates = nn_scale.memory_estimates(federation, n, seed)
  assert estimates["raw_data_bytes"] == data.x.nbytes + data.y.nbytes
  assert estimates["padded_data_bytes"] == sum(a.nbytes for a in (
      padded.x, padded.y, padded.x_test, padded.y_test))
  train_rows, test_rows = nn_scale.client_sizes(federation, n, seed)
  np.testing.assert_array_equal(train_rows, data.counts)
  np.testing.assert_array_equal(test_rows, data.test_counts)
  x, y, train, test = nn_scale.generate(federation, n, seed)
  np.testing.assert_array_equal(x, data.x)
  np.testing.assert_array_equal(y, data.y)


# 100 FEMNIST clients (23k images of 28x28) show the mean size as well as 500, in a fifth
# of the time.
@pytest.mark.parametrize("name, n", [("femnist", 100), ("sent140", 500)])
def test_mock_federations_have_their_sizes_and_shapes(nn_scale, name, n):
  federation = nn_scale.FEDERATIONS[name]
  x, y, train, test = nn_scale.generate(federation, n, 0)
  assert x.shape == (train.sum() + test.sum(), *federation.input_shape)
  assert x.dtype == federation.input_dtype and y.dtype == np.int32
  assert train.min() >= 1 and test.min() >= 1 and 0 <= y.min() and y.max() < federation.classes
  sizes = train + test
  mean = {"femnist": 227, "sent140": 2 + 2.42}[name]
  assert abs(sizes.mean() - mean) < 0.15 * mean
  assert nn_scale.memory_estimates(federation, n, 0)["raw_data_bytes"] == x.nbytes + y.nbytes
  again = nn_scale.generate(federation, n, 0)
  np.testing.assert_array_equal(again[0], x)


@pytest.mark.slow
def test_the_quick_run_writes_rows_and_the_loop_matches_the_engine(tmp_path):
  rows = run(tmp_path, "--quick")
  assert [(r["data"], r["n"]) for r in rows] == [
      ("synthetic", 100), ("synthetic", 200), ("femnist", 200), ("sent140", 1000)]
  for r in rows:
    assert KEYS <= set(r), KEYS - set(r)
    assert "error" not in r and r["loop_error"] is None
    assert r["seconds_per_round"] > 0 and r["loop_seconds_per_round"] > 0
    assert r["peak_rss_bytes"] > r["raw_data_bytes"] > 0
    assert r["padded_data_bytes"] > r["raw_data_bytes"]
    assert 1 <= r["loop_compiles"] == len(r["loop_padded_sizes"])
    assert set(r["loop_padded_sizes"]) <= set(r["engine_size_classes"])
    assert r["loop_relative_error"] < 1e-5
    if r["data"] == "synthetic":  # the mocks' random labels barely move the body: no ratio
      assert r["loop_update_relative_error"] < 1e-4
