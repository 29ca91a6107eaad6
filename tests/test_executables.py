"""The executable store: programs compiled once are called by later processes untraced."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_rep.core import executables

# Traces a program that calls LAPACK (a QR): jaxlib loads its LAPACK kernels only when
# such a program is lowered, so a stored one must not be called before they are loaded.
SCRIPT = """
import sys
import numpy as np
import jax.numpy as jnp
from fedjax_rep.core import compile_cache, executables

traces = []

@executables.jit(static_argnames=("k",))
def f(x, *, k):
  traces.append(k)
  return jnp.linalg.qr(x)[0][:, :k].sum(0) * 2

if len(sys.argv) > 2:
  compile_cache.enable(sys.argv[2])
with executables.storing(sys.argv[1]):
  out = f(np.eye(4, dtype=np.float32) + 1, k=2)
print(len(traces), repr(np.asarray(out).tolist()))
"""


def _run(*args):
  result = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, args)], check=True,
                          capture_output=True, text=True)
  traces, values = result.stdout.split(" ", 1)
  return int(traces), values


def test_a_stored_program_runs_in_a_new_process_without_tracing(tmp_path):
  first = _run(tmp_path / "store")
  second = _run(tmp_path / "store")
  assert first[0] == 1 and second[0] == 0
  assert second[1] == first[1]


def test_a_stored_lapack_program_runs_without_importing_scipy_linalg(tmp_path):
  """The process that loads the stored QR gives jaxlib scipy.linalg's two kernel tables
  without running scipy.linalg's __init__; a later `import scipy.linalg` still works."""
  expected = _run(tmp_path / "store")[1]
  script = SCRIPT + ("assert 'scipy.linalg' not in sys.modules\n"
                     "import scipy.linalg\n"
                     "assert scipy.linalg.solve([[2.0]], [1.0])[0] == 0.5\n")
  result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "store")], check=True,
                          capture_output=True, text=True)
  assert result.stdout.split(" ", 1) == ["0", expected]


def test_a_program_from_jax_persistent_cache_is_stored_compiled_afresh(tmp_path):
  """JAX's own cache holds the program already; the store compiles it again (a copy of a
  cache-loaded executable fails when called) and a third process runs the stored one."""
  reference = _run(tmp_path / "store0")[1]
  _run(tmp_path / "store1", tmp_path / "jax")  # fills JAX's cache
  assert _run(tmp_path / "store2", tmp_path / "jax") == (1, reference)
  assert _run(tmp_path / "store2", tmp_path / "jax") == (0, reference)


@executables.jit(static_argnames=("scale",))
def _scaled(x, *, scale):
  return x * (scale(2.0) if callable(scale) else scale)


def test_each_shape_and_static_value_is_its_own_program(tmp_path):
  with executables.storing(str(tmp_path)):
    np.testing.assert_array_equal(_scaled(jnp.ones(3), scale=2.0), 2 * np.ones(3))
    np.testing.assert_array_equal(_scaled(jnp.ones(4), scale=2.0), 2 * np.ones(4))
    np.testing.assert_array_equal(_scaled(jnp.ones(4), scale=3.0), 3 * np.ones(4))
    np.testing.assert_array_equal(_scaled(jnp.ones(4), scale=3.0), 3 * np.ones(4))
    assert len(os.listdir(tmp_path)) == 3


def test_static_arguments_without_a_value_repr_are_not_stored(tmp_path):
  with executables.storing(str(tmp_path)):
    np.testing.assert_array_equal(_scaled(jnp.ones(3), scale=lambda v: v + 1), 3 * np.ones(3))
  assert os.listdir(tmp_path) == []


def test_a_call_inside_another_trace_is_inlined_not_stored(tmp_path):
  """Called from a jitted or vmapped function (as fedavg-ft-fig3 does), the arguments are
  tracers: the outer program inlines the plain jit and nothing is stored."""
  with executables.storing(str(tmp_path)):
    outer = jax.jit(jax.vmap(lambda x: _scaled(x, scale=2.0)))
    np.testing.assert_array_equal(outer(jnp.ones((2, 3))), 2 * np.ones((2, 3)))
  assert os.listdir(tmp_path) == []


def test_a_named_store_loads_the_programs_its_last_block_used_in_the_background(tmp_path):
  with executables.storing(str(tmp_path), name="a"):
    _scaled(jnp.ones(3), scale=2.0)
    _scaled(jnp.ones(4), scale=2.0)
    _scaled(jnp.ones(3), scale=2.0)
  (listing,) = tmp_path.glob("*.programs")
  keys = json.loads(listing.read_text())  # in the order of their first call
  assert len(keys) == 2 and all((tmp_path / f"{key}.executable").exists() for key in keys)
  with executables.storing(str(tmp_path), name="a"):
    assert list(executables._store["pending"]) == keys
    np.testing.assert_array_equal(_scaled(jnp.ones(4), scale=2.0), 2 * np.ones(4))
    assert list(executables._store["pending"]) == keys[:1]  # the other one was claimed
  with executables.storing(str(tmp_path), name="b"):  # another name: nothing loads
    assert executables._store["pending"] == {}
  with pytest.raises(RuntimeError), executables.storing(str(tmp_path), name="a"):
    _scaled(jnp.ones(5), scale=2.0)
    raise RuntimeError("a block that fails does not list its programs")
  assert json.loads(listing.read_text()) == keys[1:]


def test_a_store_whose_list_cannot_be_written_still_runs(tmp_path, caplog):
  with executables.storing(str(tmp_path), name="a"):
    _scaled(jnp.ones(3), scale=2.0)
  (listing,) = tmp_path.glob("*.programs")
  listing.unlink()
  listing.mkdir()  # a directory where the list goes: it cannot be replaced by a file
  with executables.storing(str(tmp_path), name="a"):
    np.testing.assert_array_equal(_scaled(jnp.ones(3), scale=2.0), 2 * np.ones(3))
  assert "cannot list the stored programs" in caplog.text


def test_a_damaged_stored_program_is_compiled_again(tmp_path, caplog):
  with executables.storing(str(tmp_path)):
    _scaled(jnp.ones(3), scale=2.0)
  (path,) = tmp_path.iterdir()
  path.write_bytes(b"not a program")
  with executables.storing(str(tmp_path)):
    np.testing.assert_array_equal(_scaled(jnp.ones(3), scale=2.0), 2 * np.ones(3))
  assert "ignoring the stored program" in caplog.text
  assert path.read_bytes() != b"not a program"


def test_a_store_over_its_size_drops_the_least_recently_used_programs(tmp_path):
  for i, size in enumerate([400, 300, 200, 100]):
    path = tmp_path / f"{i}.executable"
    path.write_bytes(b"x" * size)
    os.utime(path, (1000 + i, 1000 + i))
  executables._prune(str(tmp_path), 1000)  # 1000 bytes: at the limit, nothing goes
  assert len(os.listdir(tmp_path)) == 4
  executables._prune(str(tmp_path), 900)  # over: down to 450, oldest first
  assert sorted(os.listdir(tmp_path)) == ["2.executable", "3.executable"]
