"""benchmarks/settings_memory.py: its settings are distinct lrs (nn_scale's for one), its
store of one run holds the generated arrays without a copy, its ratios are over the fewest
settings, and a tiny run writes one row per grid size with the issue's keys, each grid run
as one call of its settings."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BENCHMARKS, benchmark_module
from fedjax_rep.experiments import batch

KEYS = {"settings", "n", "rounds", "raw_data_bytes", "setup_rss_bytes", "peak_rss_bytes",
        "peak_ratio", "seconds", "state_bytes_per_setting", "width", "backend",
        "width_chosen", "load"}


@pytest.fixture(scope="module")
def settings_memory():
  return benchmark_module("settings_memory")


def test_lrs_are_distinct(settings_memory):
  assert settings_memory.lrs(1) == [0.05]
  lrs = settings_memory.lrs(8)
  assert len(set(lrs)) == 8
  assert lrs[0] == pytest.approx(0.01) and lrs[-1] == pytest.approx(0.1)


def test_the_store_has_one_run_of_the_generated_rows(settings_memory):
  data = settings_memory.store(20, 0)
  train_rows, test_rows = settings_memory.nn_scale.client_sizes(settings_memory.FEDERATION,
                                                                20, 0)
  assert data.x.shape == (1, int(train_rows.sum() + test_rows.sum()), 60)
  np.testing.assert_array_equal(data.counts, train_rows[None])
  np.testing.assert_array_equal(data.test_counts, test_rows[None])


def test_ratios_are_over_the_fewest_settings(settings_memory):
  rows = [{"settings": 8, "peak_rss_bytes": 3.0}, {"settings": 2, "peak_rss_bytes": 2.0},
          {"settings": 4, "peak_rss_bytes": None}]
  assert [r["peak_ratio"] for r in settings_memory.with_ratios(rows)] == [1.5, 1.0, None]


@pytest.mark.slow
def test_a_tiny_run_writes_a_row_per_grid_size(tmp_path):
  path = tmp_path / "rows.json"
  subprocess.run([sys.executable, os.path.join(BENCHMARKS, "settings_memory.py"), "--n",
                  "100", "--settings", "1", "2", "--rounds", "1", "--json", str(path)],
                 check=True, capture_output=True, text=True, timeout=900)
  rows = json.loads(path.read_text())
  assert [(r["settings"], r["n"], r["rounds"]) for r in rows] == [(1, 100, 1), (2, 100, 1)]
  for r in rows:
    assert KEYS <= set(r), KEYS - set(r)
    assert "error" not in r, r["error"]
    assert r["width"] == r["settings"]
    assert r["peak_rss_bytes"] >= r["setup_rss_bytes"] > 0
    assert r["seconds"] > 0 and r["raw_data_bytes"] > 0 and r["state_bytes_per_setting"] > 0
    assert len(r["load"]) == 3 and r["backend"] in ("cpu", "gpu", "tpu")
    assert r["width_chosen"] == batch.default_width(r["backend"])
  assert rows[0]["peak_ratio"] == 1.0 and rows[1]["peak_ratio"] > 0
