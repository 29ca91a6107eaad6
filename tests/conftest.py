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
