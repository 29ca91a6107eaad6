"""Runs padded to a common client count: the same cohorts and the same numbers as unpadded
runs, in one compiled program; fedrep-fig3 as one program, its sweeps, its compile cache."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.core import cohort
from fedjax_rep.linear.fedrep import TRACED_HEAD_STEPS, FedRep
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.linear.algorithms import make_algorithm
from fedjax_rep.recipes.kit import linear
from fedjax_rep.experiments import runner
from fedjax_rep.recipes.kit import shared
from fedjax_rep.core.padding import Padded


@pytest.mark.parametrize("max_clients,max_size", [(1000, 100), (1000, 1000), (40, 7)])
def test_sample_padded_draws_the_unpadded_cohort(max_clients, max_size):
  # jitted as the rounds call them: one program for every key, n and size
  sample_padded = jax.jit(cohort.sample_padded, static_argnums=(1, 2))
  for seed in range(10):
    key = jax.random.key(seed)
    for n, size in [(10, 1), (40, 7), (25, 25), (1000, 100), (700, 700)]:
      if n > max_clients or size > max_size:
        continue
      expected = np.asarray(cohort.sample_cohort(key, n, size))
      clients, mask = sample_padded(key, max_clients, max_size, jnp.int32(n), jnp.int32(size))
      clients, mask = np.asarray(clients), np.asarray(mask)
      assert mask.sum() == size
      if max_size == max_clients:  # all clients in order, the cohort as a mask
        np.testing.assert_array_equal(clients, np.arange(max_clients))
        assert set(clients[mask]) == set(expected)
      else:
        np.testing.assert_array_equal(clients[mask], expected)


@pytest.mark.parametrize("n", [  # the fast tier: the packed sort up to 1000, and beyond it
    1, 2, 7, 1000, pytest.param(cohort.PACKED_SORT_MAX, marks=pytest.mark.slow),
    cohort.PACKED_SORT_MAX + 3])
def test_stable_argsort_is_numpys_stable_argsort(n):
  """Random keys, many ties, and keys equal in their high bits but not their low ones (the
  packed sort's odd-even passes must order those), one by one and vmapped under jit."""
  rng = np.random.default_rng(n)
  keys = np.stack([rng.integers(0, 2**32, n, dtype=np.uint32),
                   rng.integers(0, 3, n).astype(np.uint32),
                   (rng.integers(0, 2**12, n) | 0xABC00000).astype(np.uint32),
                   np.full(n, 2**32 - 1, np.uint32)])
  expected = np.argsort(keys, axis=1, kind="stable")
  np.testing.assert_array_equal(jax.jit(jax.vmap(cohort.stable_argsort))(keys), expected)
  np.testing.assert_array_equal(cohort.stable_argsort(jnp.asarray(keys[2])), expected[2])


def test_padding_groups_follow_shuffle_rounds():
  assert linear.padding_groups((10, 100, 1000)) == [(10, 100, 1000)]
  assert linear.padding_groups((10, 2000, 100)) == [(10, 100), (2000,)]
  assert linear.padding_groups((10, 100), mode="fresh") == [(10,), (100,)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedrep", "gd-gd", "3gd-gd"])
def test_padded_traced_runs_equal_unpadded_runs(name):
  """FedRep, GD-GD and tau GD-GD at n in {8, 30} as one padded program (head steps traced)
  equal each algorithm's own unpadded run at each n."""
  counts, participation, seeds, rounds = (8, 30), 0.25, 2, 12
  keys = shared.seed_keys(0, seeds)
  problem = dict(dim=6, rep_dim=2, noise_std=0.05, samples=4)
  padded = linear.padded_seed_data(keys, counts, participation, **problem)
  steps = {"fedrep": 0, "gd-gd": 1, "3gd-gd": 3}[name]
  hparams = LinearHparams(lr=jnp.full(len(counts) * seeds, 0.1),
                          head_lr=jnp.full(len(counts) * seeds, 0.1),
                          head_steps=jnp.full(len(counts) * seeds, steps, jnp.int32))
  algorithm = Padded(FedRep(rep_dim=2, head_steps=TRACED_HEAD_STEPS,
                            cohort=cohort.cohort_size(max(counts), participation)))
  together = fr.run(algorithm, padded, hparams, shared.run_keys(jnp.concatenate([keys, keys])),
                    rounds, progress=False, sweep_axes=(0, 0, 0))
  for i, n in enumerate(counts):
    data = linear.seed_data(keys, num_clients=n, **problem)
    alone = fr.run(make_algorithm(name, rep_dim=2, cohort=cohort.cohort_size(n, participation)),
                   data, LinearHparams(lr=jnp.float32(0.1), head_lr=jnp.float32(0.1)),
                   shared.run_keys(keys), rounds, progress=False, sweep_axes=(0, None, 0))
    for metric in ("principal_angle", "train_loss"):
      np.testing.assert_allclose(together.metrics[metric][i * seeds:(i + 1) * seeds],
                                 alone.metrics[metric], rtol=2e-4, atol=1e-6)


@pytest.mark.slow
def test_fedrep_fig3_is_one_program_and_recompiles_nothing(compiles):
  overrides = ["num_clients=5,20", "rounds=6", "samples_per_client=3", "dim=4"]
  rows, _ = runner.run("fedrep-fig3", seeds=2, overrides=overrides, progress=False)
  chunks = [name for name in compiles.names if "_run_chunk" in name]
  assert len(chunks) == 1  # every algorithm and n in one program
  compiles.reset()
  again, _ = runner.run("fedrep-fig3", seeds=2, overrides=overrides + ["lr=0.2", "seed=3"],
                          progress=False)
  assert compiles.names == []
  assert len(again) == len(rows) == 3 * 2 * 2 * 6


@pytest.mark.slow
def test_fedrep_fig3_grid_curve_equals_its_single_run():
  overrides = ["num_clients=5,20", "rounds=6", "samples_per_client=3", "dim=4"]
  rows, _ = runner.run("fedrep-fig3", seeds=2, overrides=overrides,
                         grid={"lr": [0.1, 0.3]}, progress=False)
  single, _ = runner.run("fedrep-fig3", seeds=1, overrides=overrides + ["lr=0.3", "seed=1"],
                           progress=False)
  swept = [r for r in rows if r["lr"] == 0.3 and r["seed"] == 1]
  assert len(swept) == len(single) == 3 * 2 * 6
  for a, b in zip(swept, single):
    assert (a["algorithm"], a["num_clients"], a["round"]) == (b["algorithm"], b["num_clients"],
                                                              b["round"])
    np.testing.assert_allclose([a["principal_angle"], a["train_loss"]],
                               [b["principal_angle"], b["train_loss"]], rtol=1e-4, atol=1e-7)


@pytest.mark.slow
def test_cli_compile_cache_is_on_by_default_and_changes_no_number(tmp_path):
  """Two CLI runs sharing a cache directory write byte-identical metrics.csv, and the
  first fills the cache; --no-compile-cache leaves a fresh cache directory empty, and JAX's
  own ($JAX_COMPILATION_CACHE_DIR) too."""
  args = [sys.executable, "-m", "fedjax_rep", "run", "fedrep-fig3", "--no-progress", "--set",
          "num_clients=5,20", "--set", "rounds=4", "--seeds", "1"]
  env = {**os.environ, "FEDJAX_REP_CACHE": str(tmp_path / "cache")}
  for out in ("a", "b"):
    subprocess.run(args + ["--out", str(tmp_path / out)], env=env, check=True,
                   capture_output=True)
    assert os.listdir(tmp_path / "cache")
  assert (tmp_path / "a/metrics.csv").read_bytes() == (tmp_path / "b/metrics.csv").read_bytes()
  env.update(FEDJAX_REP_CACHE=str(tmp_path / "unused"),
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "unused-jax"))
  subprocess.run(args + ["--out", str(tmp_path / "c"), "--no-compile-cache"], env=env,
                 check=True, capture_output=True)
  assert not os.path.exists(tmp_path / "unused")
  assert not os.path.exists(tmp_path / "unused-jax")
  assert (tmp_path / "a/metrics.csv").read_bytes() == (tmp_path / "c/metrics.csv").read_bytes()
