"""JAX's persistent compilation cache, on by default for the `fedjax-rep` command.

Compiled programs are stored on disk (keyed by the program, the jax/jaxlib versions and the
device), so a second run of a recipe loads them instead of compiling again; the programs
are the same, so the numbers are too. The location is $FEDJAX_REP_CACHE if set, else
$XDG_CACHE_HOME/fedjax_rep/jax (default ~/.cache/fedjax_rep/jax).
"""

import os

import jax
from jax.experimental.compilation_cache import compilation_cache

ENV = "FEDJAX_REP_CACHE"


class CacheError(OSError):
  """The compilation cache directory cannot be created."""


def default_dir() -> str:
  """$FEDJAX_REP_CACHE, else $XDG_CACHE_HOME/fedjax_rep/jax (XDG default ~/.cache)."""
  if os.environ.get(ENV):
    return os.path.expanduser(os.environ[ENV])
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "fedjax_rep", "jax")


def enable(path: str | None = None) -> str:
  """Turns on JAX's persistent compilation cache in `path`.

  Every compiled program (however quick to compile) is stored there and loaded from there in
  later processes, from the next compilation on.

  Args:
    path: the cache directory, created if missing; default `default_dir()`.

  Returns:
    The directory used.

  Raises:
    CacheError: the directory cannot be created.
  """
  path = path or default_dir()
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as error:
    raise CacheError(f"cannot create the compilation cache directory {path} ({error}); set "
                     f"{ENV} to a writable directory or pass --no-compile-cache") from None
  compilation_cache.reset_cache()  # JAX decides once per process whether to use the cache
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


def disable() -> None:
  """No persistent compilation cache from the next compilation on, even where
  $JAX_COMPILATION_CACHE_DIR names one."""
  compilation_cache.reset_cache()
  jax.config.update("jax_compilation_cache_dir", None)
