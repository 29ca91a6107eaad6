"""Compiled programs kept whole on disk, so that a later process calls them without tracing.

JAX's persistent compilation cache (`compile_cache`) spares a second process XLA's
compilation, but not the tracing and lowering that compute its key: for fedrep-fig3 about
0.7 s of a 3 s run. `jit(fun, ...)` is `jax.jit(fun, ...)` that, while a store is open
(`storing(path)`: the `fedjax-rep` command opens one in its cache directory), keeps every
program it compiles in that directory as a serialized executable
(`jax.experimental.serialize_executable`) and calls the stored one when a later process
asks for the same program. The programs are the same, so the numbers are too.

The key of a program is everything it is made of: the function's name, the package's
source (`files.source_fingerprint`), the versions of jax, jaxlib, flax and optax, the
backend and its devices, XLA_FLAGS and the jax options that change programs, the static
arguments' repr, and the structure, shapes, dtypes and weak types of the other arguments.
Code outside the package is not in the key, which is why only the command line (whose
recipes run the package's code only) opens a store. Calls that the key cannot describe
go to the plain jitted function: arguments on several devices, and static arguments whose
repr names a memory address (functions, objects without a value repr).
"""

import contextlib
import functools
import hashlib
import inspect
import logging
import os
import pickle
from importlib import metadata

import jax
import jax.numpy as jnp
from jax.experimental import serialize_executable
from jax.experimental.compilation_cache import compilation_cache

from fedjax_rep.core import files

CONFIG_OPTIONS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
                  "jax_threefry_partitionable", "jax_numpy_dtype_promotion")
VERSIONED = ("jax", "jaxlib", "flax", "optax")
MAX_BYTES = 2 << 30  # a store above this size drops its least recently used programs

_store = {"path": None, "loaded": {}}  # the open store's directory and executables in memory


@contextlib.contextmanager
def storing(path: str):
  """Within the block, `jit` functions keep their compiled programs in `path` (created).
  A store over MAX_BYTES (programs of earlier versions of the code pile up) first drops its
  least recently used programs down to half of it."""
  os.makedirs(path, exist_ok=True)
  _prune(path, MAX_BYTES)
  saved = dict(_store)
  _store.update(path=path, loaded={}, environment=_environment())
  try:
    yield path
  finally:
    _store.clear()
    _store.update(saved)


def _prune(path: str, max_bytes: int) -> None:
  """Deletes the least recently used programs of the store `path` (by modification time,
  which a load renews) until they take at most max_bytes / 2, if they take more than
  max_bytes."""
  entries = []
  for entry in os.scandir(path):
    if entry.name.endswith(".executable"):
      stat = entry.stat()
      entries.append((stat.st_mtime, stat.st_size, entry.path))
  total = sum(size for _, size, _ in entries)
  if total <= max_bytes:
    return
  for _, size, file in sorted(entries):
    if total <= max_bytes // 2:
      break
    with contextlib.suppress(FileNotFoundError):  # another process pruned it first
      os.unlink(file)
    total -= size


def _environment() -> str:
  """What every program of this process depends on besides its own arguments."""
  devices = jax.devices()
  return repr((files.source_fingerprint(), [metadata.version(name) for name in VERSIONED],
               jax.default_backend(), [d.device_kind for d in devices],
               os.environ.get("XLA_FLAGS", ""),
               [(name, getattr(jax.config, name)) for name in CONFIG_OPTIONS]))


def jit(fun=None, *, static_argnames=(), **options):
  """jax.jit(fun, static_argnames=static_argnames, **options) whose compiled programs are
  stored while a store is open (module docstring). Usable as a decorator, with or without
  arguments."""
  if fun is None:
    return functools.partial(jit, static_argnames=static_argnames, **options)
  static_argnames = (static_argnames,) if isinstance(static_argnames, str) else \
      tuple(static_argnames)
  jitted = jax.jit(fun, static_argnames=static_argnames, **options)
  names = list(inspect.signature(fun).parameters)
  name = f"{fun.__module__}.{fun.__qualname__}"

  @functools.wraps(fun)
  def call(*args, **kwargs):
    if _store["path"] is None:
      return jitted(*args, **kwargs)
    static = {**{names[i]: a for i, a in enumerate(args) if names[i] in static_argnames},
              **{k: v for k, v in kwargs.items() if k in static_argnames}}
    dynamic = (tuple(a for i, a in enumerate(args) if names[i] not in static_argnames),
               {k: v for k, v in kwargs.items() if k not in static_argnames})
    key = _key(name, static, dynamic)
    if key is None:
      return jitted(*args, **kwargs)
    compiled = _store["loaded"].get(key)
    if compiled is None:
      compiled = _load(key)
    if compiled is None:
      with _persistent_cache_off():
        compiled = jitted.lower(*args, **kwargs).compile()
      _save(key, compiled)
    _store["loaded"][key] = compiled
    return compiled(*dynamic[0], **dynamic[1])

  call.jitted = jitted
  return call


@contextlib.contextmanager
def _persistent_cache_off():
  """JAX's persistent compilation cache switched off within the block. An executable that
  JAX loaded from its cache cannot be serialized again (the copy fails when called:
  'Function ... not found'), so programs for the store are compiled afresh."""
  enabled = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()


def _key(name: str, static: dict, dynamic) -> str | None:
  """The sha256 naming the program of `name` for these arguments, or None when the
  arguments cannot be described by value (module docstring)."""
  leaves, treedef = jax.tree.flatten(dynamic)
  for leaf in leaves:
    if isinstance(leaf, jax.Array) and len(leaf.sharding.device_set) != 1:
      return None
  text = "\n".join([name, repr(sorted(static.items())), str(treedef),
                    repr([jax.typeof(leaf) for leaf in leaves]), _store["environment"]])
  if " at 0x" in text:
    return None
  return hashlib.sha256(text.encode()).hexdigest()


def _path(key: str) -> str:
  return os.path.join(_store["path"], f"{key}.executable")


@functools.cache
def _initialize_lapack() -> None:
  """Makes jaxlib load its LAPACK kernels. jaxlib loads them when a program that calls
  LAPACK is lowered; a stored program is not, and calling its LAPACK custom calls before
  they are loaded crashes the process. (jaxlib's own initializer; where a version lacks
  it, lowering a Cholesky does the same in 0.2 s.)"""
  try:
    from jax._src.lib import lapack
    lapack._lapack.initialize()
  except (ImportError, AttributeError):
    jax.jit(jnp.linalg.cholesky).lower(jax.ShapeDtypeStruct((1, 1), jnp.float32))


def _load(key: str):
  """The stored executable of `key`, or None when there is none or it cannot be loaded
  (then it is compiled again and replaced)."""
  try:
    with open(_path(key), "rb") as f:
      payload, in_tree, out_tree = pickle.load(f)
    _initialize_lapack()
    compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
    os.utime(_path(key))  # recently used: kept when the store is pruned
    return compiled
  except FileNotFoundError:
    return None
  except Exception as error:  # a damaged or foreign file: compile instead
    logging.warning("fedjax_rep: ignoring the stored program %s (%s)", _path(key), error)
    return None


def _save(key: str, compiled) -> None:
  """Stores `compiled` under `key`; a store that cannot be written is skipped with a warning."""
  try:
    data = pickle.dumps(serialize_executable.serialize(compiled))
    files.atomic_write(_path(key), lambda f: f.write(data))
  except (OSError, pickle.PicklingError, TypeError, ValueError) as error:
    logging.warning("fedjax_rep: cannot store a compiled program in %s (%s)",
                    _store["path"], error)
