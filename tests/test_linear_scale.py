"""The linear FedRep round in client blocks, the statistics sampler of fresh data, the
streamed initialisation and the memory estimate: blocked = unblocked = numpy reference,
statistics ~ direct in distribution; benchmarks/scale.py's jobs of several processes give
the single process's numbers."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import fedjax_rep as fr
import reference as ref
from fedjax_rep.core import memory as core_memory
from fedjax_rep.core import normals
from fedjax_rep.linear import blocks, fresh_statistics, memory
from fedjax_rep.linear.fedrep import TRACED_HEAD_STEPS
from conftest import BENCHMARKS, benchmark_module

N, M, D, K = 23, 6, 7, 2  # 23 clients: blocks of 5 leave a remainder of 3
ROUNDS = 2
RTOL, ATOL = 2e-4, 2e-5
HP = fr.LinearHparams(lr=jnp.float32(0.1), head_lr=jnp.float32(0.05))


def problem(n=N, seed=0):
  return fr.make_problem(jax.random.key(seed), n, D, K, 0.1)


def datasets(n=N):
  """Fixed, fresh (direct) and fresh (statistics) data of one ground truth."""
  p = problem(n)
  return {"fixed": fr.make_fixed_data(jax.random.key(1), p, M),
          "fresh": fr.FreshData(p, M),
          "fresh-statistics": fr.FreshData(p, M, sampler="statistics")}


def final(algorithm, data, hparams=HP):
  result = fr.run(algorithm, data, hparams, jax.random.key(4), ROUNDS, progress=False)
  return result.state, result.metrics["train_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fixed", "fresh", "fresh-statistics"])
@pytest.mark.parametrize("cohort,head_steps", [(N, (0, 1)), (11, (0, 2))],
                         ids=["all-steps-0-1", "cohort-11-steps-0-2"])
def test_blocks_of_c_2c_and_one_block_agree(mode, cohort, head_steps):
  """Exact heads (0 head steps) and head GD steps, the number traced: one program for each
  block size serves both."""
  data = datasets()[mode]
  algorithms = [fr.FedRep(rep_dim=K, cohort=cohort, head_steps=TRACED_HEAD_STEPS, block=block)
                for block in (5, 10, None)]  # None: one block of all 23 here
  for steps in head_steps:
    runs = [final(algorithm, data, HP.replace(head_steps=jnp.int32(steps)))
            for algorithm in algorithms]
    for state, losses in runs[1:]:
      np.testing.assert_allclose(state.B, runs[0][0].B, rtol=RTOL, atol=ATOL)
      np.testing.assert_allclose(state.heads, runs[0][0].heads, rtol=RTOL, atol=ATOL)
      np.testing.assert_allclose(losses, runs[0][1], rtol=RTOL, atol=ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fixed", "fresh"])
@pytest.mark.parametrize("head_steps", [None, 3])
def test_blocked_round_matches_numpy_reference(mode, head_steps):
  """One round in blocks of 5 against the per-client numpy loop on the same samples (fresh:
  the unblocked sampler `data.batch` of the round's data key)."""
  data = datasets()[mode]
  algorithm = fr.FedRep(rep_dim=K, cohort=N, head_steps=head_steps, block=5)
  state = fr.init_state(algorithm, data, HP, jax.random.key(2))
  state = state.replace(heads=jax.random.normal(jax.random.key(5), state.heads.shape))
  key = jax.random.key(6)
  new, metrics = jax.jit(algorithm.round)(state, key, data, HP)
  X, y = data.batch(jax.random.split(key)[1], jnp.arange(N))
  B, heads, loss = ref.fedrep_round(state.B, state.heads, np.asarray(X), np.asarray(y),
                                    range(N), 0.1, head_steps, 0.05)
  np.testing.assert_allclose(new.B, B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(new.heads, heads, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(metrics["train_loss"], loss, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_masked_round_in_blocks_matches_unblocked():
  data = datasets()["fixed"]
  clients = jnp.array([3, 17, 0, 9, 22, 5, 11])
  mask = jnp.array([True, False, True, True, False, True, True])
  outputs = []
  for block in (2, None):
    algorithm = fr.FedRep(rep_dim=K, cohort=7, head_steps=1, block=block)
    state = fr.init_state(algorithm, data, HP, jax.random.key(2))
    outputs.append(jax.jit(algorithm.masked_round)(state, jax.random.key(3), data, HP, clients,
                                                   mask))
  np.testing.assert_allclose(outputs[0][0].B, outputs[1][0].B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(outputs[0][0].heads, outputs[1][0].heads, rtol=RTOL, atol=ATOL)
  unmasked = np.setdiff1d(np.arange(N), np.asarray(clients)[np.asarray(mask)])
  np.testing.assert_array_equal(outputs[0][0].heads[unmasked], 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("steps,fixed_steps", [(0, None), (2, 2)])
def test_traced_head_steps_in_blocks(steps, fixed_steps):
  data = datasets()["fixed"]
  hp = HP.replace(head_steps=jnp.int32(steps))
  traced = fr.FedRep(rep_dim=K, cohort=N, head_steps=TRACED_HEAD_STEPS, block=5)
  plain = fr.FedRep(rep_dim=K, cohort=N, head_steps=fixed_steps, block=5)
  a = fr.run(traced, data, hp, jax.random.key(4), ROUNDS, progress=False).state
  b = fr.run(plain, data, hp, jax.random.key(4), ROUNDS, progress=False).state
  np.testing.assert_allclose(a.B, b.B, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(a.heads, b.heads, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_rounds_in_blocks_compile_once(compiles):
  algorithm = fr.FedRep(rep_dim=K, cohort=N, block=6)  # a program no other test compiles
  data = datasets()["fresh-statistics"]
  state = fr.init_state(algorithm, data, HP, jax.random.key(0))
  compiles.reset()
  fr.run(algorithm, data, HP, jax.random.key(0), 6, chunk=2, state=state, progress=False)
  assert compiles.names.count("jit(_run_chunk)") == 1


# --- the streamed initialisation -------------------------------------------------------------


def test_streamed_moments_match_the_reference():
  data = datasets()["fixed"]
  expected = ref.method_of_moments(np.asarray(data.X), np.asarray(data.y), K)
  for block in (4, None):
    B0 = fr.init_representation(jax.random.key(0), data, K, "moments", block=block)
    np.testing.assert_allclose(np.abs(B0.T @ expected), np.eye(K), atol=1e-4)


@pytest.mark.slow
def test_streamed_moments_of_fresh_data_use_the_batch_samples():
  data = datasets()["fresh"]
  key = jax.random.key(3)
  X, y = data.batch(key, jnp.arange(N))
  expected = fr.method_of_moments(X, y, K)
  for sampler in ("direct", "statistics"):
    data = fr.FreshData(data.problem, M, sampler=sampler)
    B0 = fr.init_representation(key, data, K, "moments", block=4)
    np.testing.assert_allclose(np.abs(B0.T @ expected), np.eye(K), atol=1e-4)


# --- the statistics sampler ------------------------------------------------------------------


def one_round_outputs(sampler, head_steps, keys):
  """(B [S, d, k], heads [S, n, k], loss [S]) of one round from a fixed state, per key.
  m = 12 >> k keeps the heads' tails light enough for sample standard deviations."""
  p = problem(n=3, seed=1)
  data = fr.FreshData(p, 12, sampler=sampler)
  algorithm = fr.FedRep(rep_dim=K, cohort=3, head_steps=head_steps)
  B = jnp.linalg.qr(p.B_star + 0.5 * jax.random.normal(jax.random.key(9), p.B_star.shape))[0]
  state = fr.RepState(B=B, heads=0.5 * jnp.ones((3, K)))

  def one(key):
    new, metrics = algorithm.round(state, key, data, HP)
    return new.B, new.heads, metrics["train_loss"]

  return jax.jit(jax.vmap(one))(keys)


@pytest.mark.slow
@pytest.mark.parametrize("head_steps", [None, 1])
def test_statistics_sampler_matches_direct_in_distribution(head_steps):
  """Means and standard deviations of every output of one round over 4000 keys agree
  within 5 standard errors, and two-sample KS tests on the loss and on a representation
  entry do not reject (p > 0.001)."""
  samples = 4000
  direct = one_round_outputs("direct", head_steps, jax.random.split(jax.random.key(1), samples))
  stats = one_round_outputs("statistics", head_steps,
                            jax.random.split(jax.random.key(2), samples))
  for a, b in zip(direct, stats):
    a, b = np.asarray(a).reshape(samples, -1), np.asarray(b).reshape(samples, -1)
    error = np.sqrt((a.var(0) + b.var(0)) / samples)
    assert np.all(np.abs(a.mean(0) - b.mean(0)) <= 5 * error + 1e-7)
    np.testing.assert_allclose(b.std(0), a.std(0), rtol=0.1, atol=1e-6)
  for a, b in ((direct[2], stats[2]), (direct[0][:, 0, 0], stats[0][:, 0, 0])):
    assert scipy.stats.ks_2samp(np.asarray(a), np.asarray(b)).pvalue > 1e-3


def test_householder_basis_contains_rank_deficient_spans():
  B = fr.make_problem(jax.random.key(0), 2, 9, 3, 0.1).B_star
  for M in (jnp.concatenate([B, B], 1), jnp.concatenate([B, B + 1e-7], 1),
            jnp.zeros((9, 6)), jax.random.normal(jax.random.key(1), (9, 6))):
    Q = fresh_statistics.householder_basis(M)
    np.testing.assert_allclose(Q.T @ Q, np.eye(6), atol=2e-6)
    np.testing.assert_allclose(Q @ (Q.T @ M), M, atol=2e-5)


def test_psd_cholesky_of_zero_and_rank_one():
  w = jnp.array([1.0, -2.0, 0.5])
  for S in (jnp.zeros((3, 3)), jnp.outer(w, w), jnp.outer(w, w) + jnp.eye(3)):
    L = fresh_statistics.cholesky_psd(S)
    assert np.all(np.isfinite(L)) and np.allclose(np.triu(L, 1), 0)
    np.testing.assert_allclose(L @ L.T, S, atol=1e-5)


@pytest.mark.slow
def test_unrolled_normals_equal_jax_random_normal():
  key = jax.random.key(11)
  for shape in ((1,), (7,), (6, 10), (3, 5, 7)):
    np.testing.assert_array_equal(jax.jit(normals.normal, static_argnums=1)(key, shape),
                                  jax.random.normal(key, shape))
  keys = jax.random.split(key, 5)
  np.testing.assert_array_equal(jax.vmap(lambda k: normals.normal(k, (4, 3)))(keys),
                                jax.vmap(lambda k: jax.random.normal(k, (4, 3)))(keys))


def test_normal_pairs_are_standard_normal_and_independent():
  """Both halves (the two words of each hash) are N(0, 1) (KS test) and uncorrelated; odd
  sizes and other key implementations work."""
  draws = np.asarray(jax.jit(normals.normal_pairs, static_argnums=1)(jax.random.key(5), 40000))
  for half in (draws[:20000], draws[20000:]):
    assert scipy.stats.kstest(half, "norm").pvalue > 1e-3
  assert abs(np.corrcoef(draws[:20000], draws[20000:])[0, 1]) < 0.03
  assert normals.normal_pairs(jax.random.key(5), 7).shape == (7,)
  rbg = jax.random.key(5, impl="rbg")
  np.testing.assert_array_equal(normals.normal_pairs(rbg, 6), jax.random.normal(rbg, (6,)))


# --- blocks, memory, bad inputs --------------------------------------------------------------


@pytest.mark.parametrize("num,block", [(10, 3), (10, 5), (10, 10), (10, 20), (1, 1)])
def test_map_blocks_sums_and_concatenates(num, block):
  values = jnp.arange(num, dtype=jnp.float32)

  def fn(start, size, parts):
    (v,) = parts
    return {"sum": jnp.sum(v), "first": jnp.sum(start == 0).astype(jnp.float32)}, 2 * v

  sums, outputs = jax.jit(lambda v: blocks.map_blocks(fn, num, block, (v,)))(values)
  assert float(sums["sum"]) == float(values.sum())
  assert float(sums["first"]) == 1.0
  np.testing.assert_array_equal(outputs, 2 * values)


def test_block_size_from_cache_and_given():
  assert blocks.cache_bytes() >= 1 << 15
  assert blocks.block_size(10, 1 << 40) == 1
  assert blocks.block_size(10, 1) == 10
  assert blocks.block_size(100, 8, 7) == 7
  with pytest.raises(ValueError, match="block"):
    blocks.block_size(100, 8, 0)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_block_size_on_cpu_and_accelerator(monkeypatch, backend):
  """On the CPU a block's data fit its cache (a fixed dataset's blocks, read from memory,
  in twice as many caches as generated ones); on an accelerator they fill
  DEVICE_BLOCK_BYTES, whether read or generated."""
  monkeypatch.setattr(blocks.jax, "default_backend", lambda: backend)
  client = 2040  # bytes of one client's data: 10 samples of 50 features and a label
  generated, read = (blocks.block_size(10**8, client, read=r) for r in (False, True))
  if backend == "cpu":
    assert generated == blocks.CACHE_MULTIPLE * blocks.cache_bytes() // client
    assert read == blocks.READ_CACHE_MULTIPLE * blocks.cache_bytes() // client
  else:
    assert generated == read == blocks.DEVICE_BLOCK_BYTES // client
  assert blocks.block_size(10, client) == 10  # never more than the clients


def test_memory_estimate_and_check():
  fresh = memory.estimate(10_000_000, 50, 5, 10, "fresh-statistics")
  fixed = memory.estimate(10_000_000, 50, 5, 10, "fixed")
  assert fresh["data"] == 0 and fixed["data"] == 4 * 10_000_000 * 10 * 51
  assert fresh["total"] < 4e9 < fixed["total"]
  assert fresh["total"] == sum(v for k, v in fresh.items() if k != "total")
  with pytest.raises(ValueError, match="fresh data") as error:
    memory.check(10_000_000, 50, 5, 10, "fixed", available=8 << 30)
  assert "\n" not in str(error.value)
  memory.check(10_000_000, 50, 5, 10, "fresh", available=8 << 30)
  with pytest.raises(ValueError, match="mode"):
    memory.estimate(10, 5, 2, 3, "population")


def test_available_memory_of_accelerator_devices(monkeypatch):
  """On an accelerator the check weighs the estimate against the free memory of the devices
  the run uses (their allocator's limit less what is in use), not the host's."""
  class Device:
    def __init__(self, in_use):
      self.in_use = in_use

    def memory_stats(self):
      return {"bytes_limit": 80 << 30, "bytes_in_use": self.in_use}

  monkeypatch.setattr(core_memory.jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(core_memory.jax, "devices", lambda: [Device(1 << 30), Device(3 << 30)])
  assert core_memory.available_bytes() == 79 << 30
  assert core_memory.available_bytes(devices=2) == 156 << 30
  fixed = memory.estimate(10_000_000, 50, 5, 10, "fixed")["total"]  # 22 GB: fits 79 GiB
  assert memory.check(10_000_000, 50, 5, 10, "fixed")["total"] == fixed
  with pytest.raises(ValueError, match="GB available"):
    memory.check(40_000_000, 50, 5, 10, "fixed")


def test_bad_structure_is_rejected_before_work():
  with pytest.raises(ValueError, match="block"):
    fr.FedRep(rep_dim=K, cohort=N, block=0)
  with pytest.raises(ValueError, match="devices"):
    fr.FedRep(rep_dim=K, cohort=N, devices=0)
  with pytest.raises(ValueError, match="client_groups"):
    fr.FedRep(rep_dim=K, cohort=N, devices=2, client_groups=3)
  with pytest.raises(ValueError, match="sampler"):
    fr.FreshData(problem(), M, sampler="fast")
  with pytest.raises(ValueError, match="multiples"):
    final(fr.FedRep(rep_dim=K, cohort=10, client_groups=4), datasets()["fixed"])
  with pytest.raises(ValueError, match="num_devices"):
    final(fr.FedRep(rep_dim=K, cohort=N, devices=64), datasets()["fixed"])


# --- benchmarks/scale.py --processes ---------------------------------------------------------



def scale_rows(tmp_path, *arguments) -> list[dict]:
  """benchmarks/scale.py's JSON rows of one call."""
  path = tmp_path / "rows.json"
  subprocess.run([sys.executable, os.path.join(BENCHMARKS, "scale.py"), *arguments,
                  "--json", str(path)], check=True, capture_output=True, text=True,
                 timeout=300)
  return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("arguments", [
    ("--round", "linear", "--clients", "1000", "--mode", "fresh-statistics"),
    ("--round", "neural", "--clients", "32")], ids=["linear", "neural"])
def test_scale_job_of_two_processes_matches_one_process(tmp_path, arguments):
  """The same configuration (2 devices in all) as one process and as a job of two processes
  of one device each (gloo collectives): the same final principal angle (linear) or train
  loss (neural), within float32 round-off."""
  one, two = scale_rows(tmp_path, *arguments, "--devices", "2", "--processes", "1,2",
                        "--rounds", "2")
  if "gloo" in two.get("error", "").lower():
    pytest.skip(f"gloo CPU collectives cannot run here: {two['error']}")
  for row, processes in ((one, 1), (two, 2)):
    assert row["processes"] == processes and row["devices"] == 2
    assert "error" not in row, row["error"]
    assert row["seconds_per_round"] > 0 and row["peak_rss_gb"] > 0
  assert len(two["seconds_per_round_each"]) == 2
  assert two["peak_rss_gb_total"] >= two["peak_rss_gb"]
  np.testing.assert_allclose(two["final_metric"], one["final_metric"], rtol=1e-4)


@pytest.fixture(scope="module")
def scale():
  """benchmarks/scale.py as a module (its top level imports only the standard library)."""
  return benchmark_module("scale")


def test_scale_splits_the_cores_and_devices_among_processes(scale):
  assert scale.process_cpus(2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
  assert scale.process_cpus(3, [0, 1, 2, 3]) == [[0], [1], [2, 3]]
  assert scale.process_cpus(4, [5, 7]) == [[5], [7], [5], [7]]  # more processes than cores
  config = {"processes": 2, "devices": 8, "platform": "cpu"}
  envs = scale.job_environments(config)
  assert [env["PROCESS_ID"] for env in envs] == ["0", "1"]
  assert {env["NUM_PROCESSES"] for env in envs} == {"2"}
  assert len({env["JAX_COORDINATOR_ADDRESS"] for env in envs}) == 1
  assert all(env["XLA_FLAGS"].split()[-1] == "--xla_force_host_platform_device_count=4"
             and env["XLA_FLAGS"].count("device_count") == 1 for env in envs)
  single = scale.job_environments({**config, "processes": 1})
  assert len(single) == 1 and "PROCESS_ID" not in single[0]


def test_scale_refuses_devices_not_a_multiple_of_processes():
  done = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "scale.py"), "--devices", "3",
                         "--processes", "2"], capture_output=True, text=True, timeout=60)
  assert done.returncode == 2 and "not a multiple of --processes 2" in done.stderr
