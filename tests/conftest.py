import jax
import pytest

_compiles = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, duration, **kw: _compiles.append(name)
    if name == "/jax/core/compile/backend_compile_duration" else None)


class CompileCounter:
  """Counts XLA compilations since the counter was created (or last reset)."""

  def __init__(self):
    self.start = len(_compiles)

  @property
  def count(self) -> int:
    return len(_compiles) - self.start

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
