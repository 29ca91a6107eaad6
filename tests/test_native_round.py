"""The opt-in C++ FedRep rounds (`fedjax_rep.native.fedrep_round`, FedRep(kernel="native"))
on fixed data and on fresh data of the statistics sampler against numpy references and the
XLA round, under jit and vmap, in a run and on 8 devices (test_linear_sharding); the default
kernel="xla" never invokes a compiler; failures to build are one-line errors before any
work."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.linear import fresh_statistics
from fedjax_rep.native import build
from fedjax_rep.native import fedrep_round

import reference

HP = fr.LinearHparams(lr=jnp.float32(0.1), head_lr=jnp.float32(0.1))

pytestmark = pytest.mark.slow  # the opt-in C++ kernel: the slow tier builds and checks it


def numpy_round(X, y, counts, B):
  """(heads [n, k], gradient [k, d], loss) of `fedrep_round.fixed_round`, by a float64 loop."""
  X, y, B = (np.asarray(a, np.float64) for a in (X, y, B))
  heads, gradient, loss = [], np.zeros((B.shape[1], X.shape[2])), 0.0
  for Xi, yi, count in zip(X, y, np.asarray(counts)):
    Z = Xi @ B
    w = reference.least_squares(Z, yi)
    r = Z @ w - yi
    heads.append(w)
    gradient += np.outer(w, Xi.T @ r) / count
    loss += r @ r / (2 * count)
  return np.array(heads), gradient, loss


def client_data(n, m, d, k, padded, seed=0):
  """X [n, m, d], y [n, m] (rows past counts zero), counts [n], B [d, k], float32."""
  rng = np.random.default_rng(seed)
  X = rng.standard_normal((n, m, d)).astype(np.float32)
  y = rng.standard_normal((n, m)).astype(np.float32)
  counts = rng.integers(k, m + 1, n) if padded else np.full(n, m)
  rows = np.arange(m)[None, :] < counts[:, None]
  X, y = X * rows[..., None], y * rows
  B = (rng.standard_normal((d, k)) / np.sqrt(d)).astype(np.float32)
  return X, y, counts.astype(np.float32), B


def numpy_fresh_round(key, offset, heads_star, coords_star, coords, noise_std, m):
  """(heads, gradient, loss, outside) of `fedrep_round.fresh_round`: `numpy_round` on the
  samples `fresh_statistics.sample` draws, and outside = sum_i ||r_i / m||^2 w_i w_i^T, by a
  float64 loop."""
  n = heads_star.shape[0]
  A, y = fresh_statistics.sample(key, coords_star, heads_star, noise_std, m,
                                 offset + jnp.arange(n))
  heads, gradient, loss = numpy_round(A, y, np.full(n, m), coords)
  A, y = np.asarray(A, np.float64), np.asarray(y, np.float64)
  outside = np.zeros((heads.shape[1],) * 2)
  for Ai, yi, w in zip(A, y, heads):
    r = Ai @ np.asarray(coords, np.float64) @ w - yi
    outside += (r @ r) / m ** 2 * np.outer(w, w)
  return heads, gradient, loss, outside


def fresh_inputs(n, d, k, seed=0):
  """heads_star [n, k], coords_star and coords [2k, k] in the basis of random B, B* [d, k]."""
  rng = np.random.default_rng(seed)
  B, B_star = (jnp.asarray(rng.standard_normal((d, k)) / np.sqrt(d), jnp.float32)
               for _ in range(2))
  Q = fresh_statistics.basis(B, B_star)
  heads_star = jnp.asarray(rng.standard_normal((n, k)), jnp.float32)
  return heads_star, Q.T @ B_star, Q.T @ B


@pytest.fixture(scope="module")
def kernel():
  """Builds and loads the kernels; skips the module only where there is no C++ compiler (a
  compiler whose build fails is an error)."""
  if not build.has_compiler():
    pytest.skip("no C++ compiler to build the kernel")
  fedrep_round.load(fedrep_round.FIXED)
  fedrep_round.load(fedrep_round.FRESH)


def assert_matches(got, want):
  for name, g, w in zip(("heads", "gradient", "loss", "outside"), got, want):
    np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4 * np.abs(w).max(), err_msg=name)


# n: not a multiple of 8 clients, more than one chunk of 512; m: below, at and above the 12
# rows accumulated together; k: 1, 5 and the largest, 8.
@pytest.mark.parametrize("n, m, d, k, padded", [(37, 10, 50, 5, False), (1030, 3, 7, 1, True),
                                                (20, 14, 9, 8, True), (9, 12, 16, 8, False)])
def test_kernel_matches_the_numpy_reference_under_jit(n, m, d, k, padded, kernel):
  X, y, counts, B = client_data(n, m, d, k, padded)
  got = jax.jit(fedrep_round.fixed_round)(X, y, counts, B)
  assert_matches(got, numpy_round(X, y, counts, B))


def test_kernel_under_vmap_matches_each_call(kernel):
  X, y, counts, B = client_data(40, 10, 12, 3, True)
  Bs = np.stack([B, 2 * B, -B])
  batched = jax.jit(jax.vmap(fedrep_round.fixed_round, in_axes=(None, None, None, 0)))(
      X, y, counts, Bs)
  for s in range(3):
    assert_matches([out[s] for out in batched], numpy_round(X, y, counts, Bs[s]))


def test_kernel_is_deterministic(kernel):
  X, y, counts, B = client_data(3000, 10, 20, 5, False)
  first = jax.jit(fedrep_round.fixed_round)(X, y, counts, B)
  for again in (jax.jit(fedrep_round.fixed_round)(X, y, counts, B),
                fedrep_round.fixed_round(X, y, counts, B)):
    for a, b in zip(first, again):
      np.testing.assert_array_equal(a, b)


# n: not a multiple of 8, more than one chunk; m (p + 1) a multiple of 16 and not; k: 1 and 8;
# offset: the first client's id (a device's clients).
@pytest.mark.parametrize("n, m, d, k, offset", [(37, 10, 50, 5, 0), (1030, 3, 7, 1, 5),
                                                (20, 14, 20, 8, 100), (9, 5, 12, 3, 0)])
def test_fresh_kernel_matches_the_numpy_reference_on_the_samplers_draws(n, m, d, k, offset,
                                                                         kernel):
  heads_star, coords_star, coords = fresh_inputs(n, d, k)
  key = jax.random.key(7)
  got = jax.jit(fedrep_round.fresh_round, static_argnums=6)(
      key, offset, heads_star, coords_star, coords, 0.3, m)
  assert_matches(got, numpy_fresh_round(key, offset, heads_star, coords_star, coords, 0.3, m))


def test_fresh_kernel_under_vmap_over_keys_matches_each_call(kernel):
  heads_star, coords_star, coords = fresh_inputs(40, 12, 3)
  keys = jax.vmap(jax.random.key)(jnp.arange(3))
  batched = jax.jit(jax.vmap(fedrep_round.fresh_round, in_axes=(0, None, None, None, None,
                                                                None, None)),
                    static_argnums=6)(keys, 0, heads_star, coords_star, coords, 0.1, 10)
  for s in range(3):
    assert_matches([out[s] for out in batched],
                   numpy_fresh_round(keys[s], 0, heads_star, coords_star, coords, 0.1, 10))


def test_fresh_kernel_is_deterministic(kernel):
  heads_star, coords_star, coords = fresh_inputs(3000, 20, 5)
  call = lambda: fedrep_round.fresh_round(jax.random.key(1), 3, heads_star, coords_star,
                                          coords, 0.1, 10)
  first = call()
  for a, b in zip(first, call()):
    np.testing.assert_array_equal(a, b)


def fixed_data(n=64, m=10, d=12, k=3, seed=0):
  problem = fr.make_problem(jax.random.key(seed), n, d, k, 0.1)
  return fr.make_fixed_data(jax.random.key(seed + 1), problem, m)


def fresh_data(n=64, m=10, d=12, k=3, sampler="statistics"):
  return fr.FreshData(fr.make_problem(jax.random.key(0), n, d, k, 0.1), m, sampler=sampler)


@pytest.mark.parametrize("data", [fixed_data(), fresh_data()], ids=["fixed", "fresh"])
def test_native_and_xla_runs_agree_and_compile_once(data, compiles, kernel):
  runs = {}
  for kernel in ("xla", "native"):
    algorithm = fr.FedRep(rep_dim=3, cohort=64, kernel=kernel)
    compiles.reset()
    runs[kernel] = fr.run(algorithm, data, HP, jax.random.key(2), 12, chunk=4, progress=False)
    assert compiles.names.count("jit(_run_chunk)") == 1
  xla, ours = runs["xla"], runs["native"]
  np.testing.assert_allclose(ours.state.B, xla.state.B, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(ours.state.heads, xla.state.heads, rtol=1e-3, atol=1e-4)
  for name in ("train_loss", "principal_angle"):
    np.testing.assert_allclose(ours.metrics[name], xla.metrics[name], rtol=1e-4, atol=1e-6)


def test_native_round_matches_the_reference_round(kernel):
  data = fixed_data(n=30)
  algorithm = fr.FedRep(rep_dim=3, cohort=30, kernel="native")
  state = fr.init_state(algorithm, data, HP, jax.random.key(0))
  new, metrics = jax.jit(algorithm.round)(state, jax.random.key(1), data, HP)
  B, heads, loss = reference.fedrep_round(state.B, state.heads, data.X, data.y, range(30), 0.1)
  np.testing.assert_allclose(new.B, B, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new.heads, heads, rtol=1e-3, atol=1e-4)
  np.testing.assert_allclose(metrics["train_loss"], loss, rtol=1e-5)


def test_seed_sweep_with_the_kernel_matches_single_runs(kernel):
  datas = [fixed_data(seed=seed) for seed in range(3)]
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *datas)
  keys = jax.vmap(jax.random.key)(jnp.arange(3))
  algorithm = fr.FedRep(rep_dim=3, cohort=64, kernel="native")
  swept = fr.run(algorithm, stacked, HP, keys, 5, sweep_axes=(0, None, 0), progress=False)
  for s in range(3):
    single = fr.run(algorithm, datas[s], HP, jax.random.key(s), 5, progress=False)
    np.testing.assert_allclose(swept.state.B[s], single.state.B, rtol=1e-6, atol=1e-7)


def test_xla_never_runs_the_kernel_and_native_always_does(kernel):
  big = fixed_data(n=2200, m=10, d=50, k=5)
  assert not fr.FedRep(rep_dim=5, cohort=2200)._runs_native(big, True)
  assert fr.FedRep(rep_dim=5, cohort=2200, kernel="native")._runs_native(big, True)
  fresh = fresh_data(n=20, m=10, d=50, k=5)
  assert fr.FedRep(rep_dim=5, cohort=20, kernel="native")._runs_native(fresh, True)
  with pytest.raises(ValueError, match="threefry2x32.*use kernel='xla'"):
    fr.FedRep(rep_dim=5, cohort=20, kernel="native")._runs_native(
        fresh, True, jax.random.key(0, impl="rbg"))


def test_native_refuses_masked_rounds():
  algorithm = fr.FedRep(rep_dim=3, cohort=8, kernel="native")
  with pytest.raises(ValueError, match="not masked_round"):
    algorithm.masked_round(None, jax.random.key(0), fixed_data(n=8), HP, jnp.arange(8))


@pytest.mark.parametrize("options, data, message", [
    ({"head_steps": 2}, fixed_data(), "exact heads only"),
    ({"cohort": 10}, fixed_data(), "full participation only"),
    ({"rep_dim": 9}, fixed_data(d=12, k=9), "rep_dim <= 8"),
    ({"rep_dim": 3}, fixed_data(m=2), "samples per client >= rep_dim"),
    ({}, fresh_data(sampler="direct"), "FreshData.sampler='statistics'. only .got FreshData"),
])
def test_native_where_it_cannot_run_is_an_error_before_work(options, data, message, compiles):
  algorithm = fr.FedRep(**{"rep_dim": 3, "cohort": 64, "kernel": "native", **options})
  key = jax.random.key(0)
  compiles.reset()  # making the key may compile; the run must not
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # fewer samples than rep_dim
    with pytest.raises(ValueError, match=message):
      fr.run(algorithm, data, HP, key, 2, progress=False)
  assert compiles.count == 0


@pytest.mark.parametrize("name", ["c++", "auto"])
def test_unknown_kernel_is_rejected(name):
  with pytest.raises(ValueError, match="kernel must be one of xla, native"):
    fr.FedRep(rep_dim=2, cohort=4, kernel=name)


def test_make_algorithm_passes_kernel_to_exact_head_fedrep_only():
  for name in ("fedrep", "fedrep-ri"):
    assert fr.make_algorithm(name, rep_dim=2, cohort=4, kernel="native").kernel == "native"
    assert fr.make_algorithm(name, rep_dim=2, cohort=4).kernel == "xla"
  for name in ("gd-gd", "10gd-gd", "fedavg", "d-gd", "flute"):
    with pytest.raises(ValueError, match=f"'{name}' runs kernel='xla' only"):
      fr.make_algorithm(name, rep_dim=2, cohort=4, kernel="native")


def failing_compiler(tmp_path):
  """A $CXX that touches tmp_path/called and exits 1; returns (its path, the marker)."""
  marker, script = tmp_path / "called", tmp_path / "failing-cxx"
  script.write_text(f"#!/bin/sh\ntouch {marker}\necho 'error: refusing to compile' >&2\n"
                    f"exit 1\n")
  script.chmod(0o755)
  return str(script), marker


def test_without_a_compiler_native_says_why_before_any_work(tmp_path, monkeypatch, compiles):
  monkeypatch.setenv("FEDJAX_REP_CACHE", str(tmp_path))  # no library built here
  monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
  monkeypatch.setattr(build, "_registered", set())
  data, key = fixed_data(), jax.random.key(0)
  compiles.reset()
  with pytest.raises(ValueError, match="no C.. compiler found.*use kernel='xla'$"):
    fr.run(fr.FedRep(rep_dim=3, cohort=64, kernel="native"), data, HP, key, 2, progress=False)
  assert compiles.count == 0


def test_native_with_a_failing_compiler_is_a_one_line_error_before_any_work(
    tmp_path, monkeypatch, compiles):
  cxx, marker = failing_compiler(tmp_path)
  monkeypatch.setenv("FEDJAX_REP_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("CXX", cxx)
  monkeypatch.setattr(build, "_registered", set())
  data, key = fixed_data(), jax.random.key(0)
  compiles.reset()
  with pytest.raises(ValueError) as error:
    fr.run(fr.FedRep(rep_dim=3, cohort=64, kernel="native"), data, HP, key, 2, progress=False)
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith("FedRep(kernel='native') cannot run this round: cannot build the "
                            f"C++ kernel fedrep_round: `{cxx} -O3")
  assert "exited 1 (error: refusing to compile)" in message
  assert marker.exists() and compiles.count == 0
  assert not list((tmp_path / "cache").glob("native/*"))


DEFAULT_RUN = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    import fedjax_rep as fr
    problem = fr.make_problem(jax.random.key(0), 20000, 8, 2, 0.1)
    data = fr.make_fixed_data(jax.random.key(1), problem, 10)
    assert data.X.size >= 2 ** 20  # the old kernel="auto" ran the C++ round from here on
    hp = fr.LinearHparams(lr=jnp.float32(0.1), head_lr=jnp.float32(0.1))
    result = fr.run(fr.FedRep(rep_dim=2, cohort=20000), data, hp, jax.random.key(2), 2,
                    progress=False)
    print("fedjax_rep.native" in sys.modules, np.asarray(result.state.B).tobytes().hex(),
          np.asarray(result.metrics["principal_angle"]).tobytes().hex())
""")


def test_the_default_kernel_never_invokes_the_compiler(tmp_path):
  """A default FedRep run big enough for the old "auto" to build the kernel: the same bits
  with a $CXX that fails (and is never called) and without $CXX, and the kernels' package is
  not even imported."""
  cxx, marker = failing_compiler(tmp_path)
  env = {name: value for name, value in os.environ.items() if name != "CXX"}
  env.update(JAX_PLATFORMS="cpu", FEDJAX_REP_CACHE=str(tmp_path / "cache"))
  outputs = []
  for extra in ({"CXX": cxx}, {}):
    done = subprocess.run([sys.executable, "-c", DEFAULT_RUN], capture_output=True, text=True,
                          timeout=120, env={**env, **extra})
    assert done.returncode == 0, done.stderr[-3000:]
    outputs.append(done.stdout.split())
  assert not marker.exists()
  assert not (tmp_path / "cache" / "native").exists()
  assert outputs[0][0] == "False" and outputs[0] == outputs[1]


def test_build_key_names_the_build_without_building(tmp_path, monkeypatch, kernel):
  monkeypatch.setenv("FEDJAX_REP_CACHE", str(tmp_path))
  key = fedrep_round.build_key()
  assert key == build.build_key("fedrep_round")
  assert key.startswith("fedrep_round-") and key.endswith(".so")
  assert build.library_path("fedrep_round") == str(tmp_path / "native" / key)
  assert not (tmp_path / "native").exists()


def test_a_build_error_is_reported_with_the_compiler_message(tmp_path, monkeypatch, kernel):
  monkeypatch.setenv("FEDJAX_REP_CACHE", str(tmp_path))
  broken = tmp_path / "broken_kernel.cc"
  broken.write_text("this is not C++\n")
  monkeypatch.setattr(build, "source", lambda name: str(broken))
  with pytest.raises(build.NativeUnavailable,
                     match="cannot build the C.. kernel broken_kernel: `.*` exited 1 .*error"):
    build.build("broken_kernel")
  assert not list(tmp_path.glob("native/*.so")) and not list(tmp_path.glob("native/*.tmp"))


def test_the_benchmark_harness_builds_and_times_both_kernels(tmp_path, kernel):
  """benchmarks/native_harness.cc compiles against the kernels' source and writes its rows."""
  root = os.path.join(os.path.dirname(__file__), "..")
  binary, rows = tmp_path / "harness", tmp_path / "rows.json"
  subprocess.run([build.compiler(), "-O1", "-std=c++17", "-pthread", "-I",
                  jax.ffi.include_dir(), os.path.join(root, "benchmarks", "native_harness.cc"),
                  "-o", str(binary)], check=True, capture_output=True, timeout=300)
  done = subprocess.run([str(binary), "2000", "1", str(rows)], capture_output=True, text=True,
                        timeout=120, check=True)
  assert "fresh / fixed" in done.stdout
  records = json.loads(rows.read_text())["rows"]
  assert [(r["round"], r["threads"]) for r in records] == [
      (name, threads) for name in ("fixed", "fixed, in cache", "fresh") for threads in (1, 2)]
  assert all(r["ms_per_round"] > 0 for r in records)
