import atexit
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

# The suite compiles hundreds of small programs and runs most of them briefly, so XLA's
# compilation takes most of its time. Two flags make that cheaper: optimisation level 1
# (the recipe tests take 0.6-0.8x as long as at the default level 2; level 0 is faster to
# compile but 2-3x slower to run the long linear recipes), and XLA:CPU's older fusion
# emitters instead of its MLIR ones (`--xla_cpu_use_fusion_emitters=false`: the slow recipe
# and Table-1 tests spent 158 s compiling instead of 286, 352 CPU-s in all instead of 492).
# The fast tier (`-m "not slow"`), which runs no long recipe, compiles at level 0: its
# reference, flat-store and convention tests took 70 CPU-s instead of 99.
# They agree with the defaults to float32 round-off, not bit for bit (fedrep-fig3 --quick:
# metrics within 3.3e-5 relative of the defaults), and every test compares runs made with
# one set of flags or against float64 references. FEDJAX_REP_TEST_OPTIMIZED=1 tests XLA's
# defaults. (The round loop compiles the neural algorithms' programs with level 1 and the
# older emitters anyway, `core.loop.QUICK_COMPILE`, whatever the flags.)
# (pytest-xdist's workers inherit the flags from the controller.)
def pytest_configure(config):
  """Adds the flags above to XLA_FLAGS before any test module makes an array (XLA reads
  them when JAX first starts its CPU backend)."""
  if (os.environ.get("FEDJAX_REP_TEST_OPTIMIZED") != "1"
      and "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", "")):
    level = 0 if config.option.markexpr == "not slow" else 1
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), f"--xla_backend_optimization_level={level}",
         "--xla_cpu_use_fusion_emitters=false"]).strip()


# One persistent compilation cache for the whole run, out of the user's: the pytest-xdist
# workers and the processes tests start (recipes, notebooks, docs) load a program another
# test compiled instead of compiling it again (the same executable, so the same numbers).
# The CLI finds it through $FEDJAX_REP_CACHE, everything else through JAX's variables. The
# controller (or the only process, with -n 0) makes it; the workers inherit its environment.
if "PYTEST_XDIST_WORKER" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="fedjax-rep-test-cache-")
  os.environ.update(FEDJAX_REP_CACHE=_cache, JAX_COMPILATION_CACHE_DIR=_cache,
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)

import jax  # noqa: E402  (after the environment above)
import pytest  # noqa: E402
from jax.experimental.compilation_cache import compilation_cache  # noqa: E402

def emulated_devices_env(count: int) -> dict:
  """os.environ for a child process with `count` emulated CPU devices (XLA_FLAGS keeps the
  flags set above)."""
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}"
  return {**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu"}


class Job:
  """`command` (an argv list) started as a job of `processes` local processes under JAX's
  multi-controller runtime (`fedjax_rep.core.distributed`: JAX_COORDINATOR_ADDRESS on a
  free loopback port, NUM_PROCESSES, PROCESS_ID), each with `devices` emulated CPU devices,
  in `cwd`; every process's stdout and stderr go to cwd/<name>-<i>.log. A context manager:
  on exit every process still running is killed."""

  def __init__(self, command, processes, devices, cwd, env=None, name="process"):
    from fedjax_rep.core.distributed import free_port
    address = f"127.0.0.1:{free_port()}"
    self.logs = [os.path.join(cwd, f"{name}-{i}.log") for i in range(processes)]
    self.processes = []
    for i, log in enumerate(self.logs):
      with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        self.processes.append(subprocess.Popen(
            command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
            env={**emulated_devices_env(devices), **(env or {}),
                 "JAX_COORDINATOR_ADDRESS": address, "NUM_PROCESSES": str(processes),
                 "PROCESS_ID": str(i)}))

  def wait(self, timeout):
    """The processes' return codes, once all have ended or `timeout` seconds have passed
    (those still running are killed: return code -9)."""
    deadline = time.monotonic() + timeout
    for process in self.processes:
      try:
        process.wait(timeout=max(deadline - time.monotonic(), 0.1))
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return [process.returncode for process in self.processes]

  def log(self, i, last=3000):
    """The last `last` characters (None: all) of process i's output."""
    with open(self.logs[i]) as f:
      return f.read()[-last:] if last else f.read()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    for process in self.processes:
      if process.poll() is None:
        process.kill()
      process.wait()


BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")


def benchmark_module(name: str):
  """benchmarks/NAME.py imported as a module (with its neighbours on the path while it
  imports)."""
  sys.path.insert(0, BENCHMARKS)
  try:
    return importlib.import_module(name)
  finally:
    sys.path.remove(BENCHMARKS)


def pytest_collection_modifyitems(items):
  """Runs the slow tests first, the notebooks (30-60 s each, the longest) first of all.
  pytest-xdist's `worksteal` schedule (pyproject.toml) gives each worker half of the tests,
  and a worker that runs out takes half of what the other has left, from its end: with the
  long tests at the front, the end of the run is short tests that even out, not one worker
  idle while the other runs a notebook."""
  items.sort(key=lambda item: (item.get_closest_marker("slow") is None,
                               item.path.name != "test_notebooks.py"))


_compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, duration, **kw: _compiles.append(kw.get("fun_name", "?"))
    if name == "/jax/core/compile/backend_compile_duration" else None)


class CompileCounter:
  """Counts XLA compilations since the counter was created (or last reset)."""

  def __init__(self):
    self.start = len(_compiles)

  @property
  def count(self) -> int:
    return len(_compiles) - self.start

  @property
  def names(self) -> list[str]:
    """The compiled programs' names (e.g. 'jit(_run_chunk)'), in order."""
    return _compiles[self.start:]

  def reset(self):
    self.start = len(_compiles)


@pytest.fixture
def compiles():
  return CompileCounter()


@pytest.fixture(autouse=True, scope="module")
def _fresh_jax_caches():
  """Drops compiled programs after each test module: one pytest process compiles
  hundreds of programs, and keeping them all made XLA:CPU crash while compiling late in
  the suite (a segfault in backend_compile_and_load)."""
  yield
  jax.clear_caches()


@pytest.fixture(autouse=True)
def _suite_cache_after_test():
  """Points JAX back at the suite's compilation cache after a test that ran the CLI with
  another cache or none."""
  yield
  if jax.config.jax_compilation_cache_dir != os.environ["JAX_COMPILATION_CACHE_DIR"]:
    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    compilation_cache.reset_cache()
