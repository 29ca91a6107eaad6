"""benchmarks/nn_sweep.py: its settings are distinct (lr, momentum) pairs (the recipe's for
one), its two variants are the batch runner at width G and 1, its comparison of their final
metrics is NaN-aware and asserts, and a tiny run of each model writes one row per grid size
with the issue's keys, the two variants agreeing, and the width the runner chooses."""

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import BENCHMARKS, benchmark_module
from fedjax_rep.experiments import batch

KEYS = {"model", "settings", "seeds", "rounds", "seconds_one_program", "seconds_one_at_a_time",
        "ratio", "compile_seconds_one_program", "compile_seconds_one_at_a_time",
        "peak_rss_bytes", "peak_rss_bytes_one_at_a_time", "max_abs_diff", "load", "backend",
        "width_chosen"}


@pytest.fixture(scope="module")
def nn_sweep():
  return benchmark_module("nn_sweep")


def test_settings_are_distinct_pairs(nn_sweep):
  assert nn_sweep.settings(1) == [(0.05, 0.5)]
  assert nn_sweep.settings(1, "cifar10-cnn") == [(0.01, 0.5)]
  pairs = nn_sweep.settings(8)
  assert len(set(pairs)) == 8
  lrs = [lr for lr, _ in pairs]
  assert lrs[0] == pytest.approx(0.01) and lrs[-1] == pytest.approx(0.1)
  assert all(0 <= momentum < 1 for _, momentum in pairs)


def test_the_variants_are_the_batch_runner_at_width_g_and_1(nn_sweep, monkeypatch):
  """Each variant is one `Batch.train` of the G settings (width G, or 1) on the seeds' data,
  its results' final metrics concatenated setting-major."""
  calls = []

  def train(self, name, algorithm, data, settings, keys, rounds, eval_every=None):
    calls.append((self.width, len(settings), keys.shape[0], rounds, eval_every))
    return [{"metrics": {"train_loss": np.full((keys.shape[0], rounds), float(g))},
             "eval": {"test_accuracy": np.full((keys.shape[0], 1), g / 10)}}
            for g in range(len(settings))]

  monkeypatch.setattr(batch.Batch, "train", train)
  args = argparse.Namespace(model="digits-mlp", seeds=2, rounds=3, clients=10,
                            client_group=1, eval_every=1, precision="float32")
  runs = nn_sweep.variants(args, 3)
  assert set(runs) == set(nn_sweep.VARIANTS)
  finals = runs["one-program"]()
  assert calls == [(3, 3, 2, 3, 1)]
  np.testing.assert_array_equal(finals["train_loss"], [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(finals["eval:test_accuracy"], [0, 0, 0.1, 0.1, 0.2, 0.2])
  runs["one-at-a-time"]()
  assert calls[1] == (1, 3, 2, 3, 1)
  assert nn_sweep.width_text(None) == "all that fit" and nn_sweep.width_text(1) == "1"


def test_max_abs_diff_is_nan_aware_and_asserts(nn_sweep):
  a = {"train_loss": np.array([1.0, np.nan]), "eval:test_accuracy": np.array([0.5, 0.25])}
  b = {"train_loss": np.array([1.0 + 1e-6, np.nan]), "eval:test_accuracy": np.array([0.5, 0.25])}
  assert nn_sweep.max_abs_diff(a, b) == pytest.approx(1e-6)
  with pytest.raises(AssertionError):
    nn_sweep.max_abs_diff(a, {**b, "eval:test_accuracy": np.array([0.5, 0.3])})
  with pytest.raises(AssertionError):
    nn_sweep.max_abs_diff(a, {**b, "train_loss": np.array([1.0, 2.0])})


@pytest.mark.slow
@pytest.mark.parametrize("model,counts,rounds,clients",
                         [("digits-mlp", (1, 2), 2, 20), ("cifar10-cnn", (2,), 1, 10)])
def test_a_tiny_run_writes_a_row_per_grid_size(model, counts, rounds, clients, tmp_path):
  path = tmp_path / "rows.json"
  subprocess.run([sys.executable, os.path.join(BENCHMARKS, "nn_sweep.py"), "--model", model,
                  "--settings", *map(str, counts), "--seeds", "1", "--rounds", str(rounds),
                  "--clients", str(clients), "--eval-every", "1", "--repeats", "1",
                  "--json", str(path)],
                 check=True, capture_output=True, text=True, timeout=900)
  rows = json.loads(path.read_text())
  assert [(r["model"], r["settings"], r["seeds"], r["rounds"]) for r in rows] == [
      (model, count, 1, rounds) for count in counts]
  for r in rows:
    assert KEYS <= set(r), KEYS - set(r)
    assert not any(key.startswith("error") for key in r), r
    assert r["seconds_one_program"] > 0 and r["seconds_one_at_a_time"] > 0
    assert r["ratio"] == pytest.approx(r["seconds_one_program"] / r["seconds_one_at_a_time"])
    assert r["compile_seconds_one_program"] > 0 and r["compile_seconds_one_at_a_time"] > 0
    assert r["peak_rss_bytes"] >= r["setup_rss_bytes_one_program"] > 0
    assert r["peak_rss_bytes_one_at_a_time"] >= r["setup_rss_bytes_one_at_a_time"] > 0
    assert 0 <= r["max_abs_diff"] < 1e-4
    assert len(r["load"]) == 3 and r["backend"] in ("cpu", "gpu", "tpu")
    assert r["width_chosen"] == batch.default_width(r["backend"])
    assert len(r["lrs_momenta"]) == r["settings"]
