"""core/threefry.py: the Threefry-2x32 hash against Random123's known answers and a plain
numpy reference; its flat CPU lowering (`--flat-threefry`) against JAX's own lowering, in
child processes so that this suite's programs keep JAX's lowering."""

import functools
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from fedjax_rep.core import threefry

MASK = 0xFFFFFFFF


def threefry_reference(k1, k2, x1, x2):
  """Threefry-2x32, 20 rounds, one element at a time in Python integers: uint32 arrays of
  the broadcast shape of the four uint32 arrays."""
  k1, k2, x1, x2 = np.broadcast_arrays(k1, k2, x1, x2)
  rotations = [13, 15, 26, 6, 17, 29, 16, 24]
  y1, y2 = np.empty(x1.shape, np.uint32), np.empty(x1.shape, np.uint32)
  for index in np.ndindex(x1.shape):
    ks = [int(k1[index]), int(k2[index])]
    ks.append(ks[0] ^ ks[1] ^ 0x1BD11BDA)
    a, b = (int(x1[index]) + ks[0]) & MASK, (int(x2[index]) + ks[1]) & MASK
    for r in range(20):
      rot = rotations[r % 8]
      a = (a + b) & MASK
      b = a ^ (((b << rot) | (b >> (32 - rot))) & MASK)
      if r % 4 == 3:  # key injection after every 4 rounds
        s = r // 4 + 1
        a = (a + ks[s % 3]) & MASK
        b = (b + ks[(s + 1) % 3] + s) & MASK
    y1[index], y2[index] = a, b
  return y1, y2


# Random123's known-answer tests for threefry2x32_20 (kat_vectors): key, counter, result.
KNOWN = [((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
         ((MASK, MASK), (MASK, MASK), (0x1CB996FC, 0xBB002BE7)),
         ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0))]


@pytest.mark.parametrize("rolled", [True, False])
@pytest.mark.parametrize("key, count, expected", KNOWN)
def test_hash_gives_random123s_known_answers(key, count, expected, rolled):
  words = [np.array([w], np.uint32) for w in (*key, *count)]
  hash_fn = jax.jit(functools.partial(threefry.hash_2x32, rolled=rolled))
  assert tuple(int(y[0]) for y in hash_fn(*words)) == expected
  assert tuple(int(y[0]) for y in threefry_reference(*words)) == expected


def test_hash_equals_the_numpy_reference_broadcast_jitted_and_vmapped():
  rng = np.random.default_rng(0)
  k1, k2 = (rng.integers(0, 2**32, (3, 1, 1), dtype=np.uint32) for _ in range(2))
  x1, x2 = (rng.integers(0, 2**32, (3, 4, 5), dtype=np.uint32) for _ in range(2))
  expected = threefry_reference(k1, k2, x1, x2)
  for got in (jax.jit(threefry.hash_2x32)(k1, k2, x1, x2),
              jax.jit(jax.vmap(threefry.hash_2x32))(k1, k2, x1, x2),
              jax.jit(functools.partial(threefry.hash_2x32, rolled=False))(k1, k2, x1, x2),
              jax.jit(threefry._flat_hash)(k1, k2, x1, x2)):
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


# Draws of every kind jax.random makes, at shapes where the hash runs on several axes (vmapped
# over keys, nested vmaps, a 3-axis draw, a 64-bit draw): their values with JAX's lowering
# and with the flat one, under both of JAX's counter schemes (jax_threefry_partitionable),
# with the flat one turned off again, and the flat programs' lowered text (where the hash's
# operands are 1-axis uint32 arrays of the draw's size).
CHILD = textwrap.dedent("""\
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from fedjax_rep.core import threefry
    keys = jax.random.split(jax.random.key(7), 3)
    draws = {
        "truncated_normal": lambda k: jax.vmap(
            lambda kk: jax.random.truncated_normal(kk, -2.0, 2.0, (32, 10)))(k),
        "uniform_nested": lambda k: jax.vmap(jax.vmap(
            lambda kk: jax.random.uniform(kk, (28,))))(jax.vmap(
                lambda kk: jax.random.split(kk, 5))(k)),
        "split": lambda k: jax.random.key_data(jax.vmap(lambda kk: jax.random.split(kk, 10))(k)),
        "fold_in": lambda k: jax.random.key_data(
            jax.vmap(jax.random.fold_in, in_axes=(0, None))(k, 11)),
        "permutation": lambda k: jax.vmap(lambda kk: jax.random.permutation(kk, 50))(k),
        "bits_3_axes": lambda k: jax.random.bits(k[0], (5, 3, 7)),
        "bits_64": lambda k: jax.random.bits(k[1], (4, 6), jnp.uint64),
    }
    def values():
      return {name: np.asarray(jax.jit(lambda k, f=f: f(k))(keys)).tolist()
              for name, f in draws.items()}
    def texts():
      return {name: jax.jit(lambda k, f=f: f(k)).lower(keys).as_text()
              for name, f in draws.items()}
    jax_values = {}
    for p in (True, False):  # both of JAX's counter schemes
      jax.config.update("jax_threefry_partitionable", p)
      jax_values[p] = values()
    threefry.use_flat(True)
    same_flat = {}
    for p in jax_values:
      jax.config.update("jax_threefry_partitionable", p)
      flat_values = values()
      same_flat.update({f"{n} {p}": jax_values[p][n] == flat_values[n] for n in draws})
    jax.config.update("jax_threefry_partitionable", True)  # JAX's default
    flat_texts = texts()
    threefry.use_flat(False)
    json.dump({"same_flat": same_flat, "same_off": values() == jax_values[True],
               "flat": threefry.flat(), "texts": flat_texts}, sys.stdout)
    """)


@pytest.mark.slow  # the fast tier keeps the hash's known answers and numpy reference
def test_flat_lowering_gives_jax_randoms_bits_on_one_axis():
  env = {**os.environ, "JAX_ENABLE_X64": "1", "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                        env=env, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout)
  assert len(result["same_flat"]) == 14
  assert result["same_flat"] == {name: True for name in result["same_flat"]}
  assert result["same_off"] and not result["flat"]
  texts = result["texts"]
  assert "tensor<960xui32>" in texts["truncated_normal"]     # 3 x 32 x 10 on one axis
  assert "tensor<420xui32>" in texts["uniform_nested"]       # 3 x 5 x 28
  assert "tensor<105xui32>" in texts["bits_3_axes"]


@pytest.mark.slow
def test_cli_flat_threefry_writes_the_same_metrics_and_records_it(tmp_path):
  """`fedjax-rep run ... --flat-threefry`: metrics.csv byte-identical to the run without
  it; config.json's code.threefry says which lowering ran, code.threefry_scope that it is
  the process's."""
  args = ["digits-personalized", "--quick", "--set", "rounds=3", "--set",
          "algorithms=fedrep,fedavg", "--set", "eval_every=3", "--no-progress"]
  outputs = {}
  for flag in ("jax", "flat"):
    out = tmp_path / flag
    done = subprocess.run([sys.executable, "-m", "fedjax_rep", "run", *args, "--out", str(out),
                           *(["--flat-threefry"] if flag == "flat" else [])],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "config.json") as f:
      code = json.load(f)["code"]
    assert code["threefry"] == flag and code["threefry_scope"] == "process"
    outputs[flag] = (out / "metrics.csv").read_bytes()
  assert outputs["flat"] == outputs["jax"]
