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
go to the plain jitted function: arguments on several devices, static arguments whose
repr names a memory address (functions, objects without a value repr), and calls inside
another trace (a jitted or vmapped caller), which the plain jit inlines.

A store opened with a name (the command line names the recipe and its settings) lists the
programs its block used under that name; the next block of the same name loads them in
background threads from its start, so that they are ready when first called (loading
releases the GIL: the threads run beside the Python work before the first call, and in
parallel with each other).
"""

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import inspect
import json
import logging
import os
import pickle
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata

import jax
import jax.numpy as jnp
from jax.experimental import serialize_executable
from jax.experimental.compilation_cache import compilation_cache

from fedjax_rep.core import files
from fedjax_rep.core import native

CONFIG_OPTIONS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
                  "jax_threefry_partitionable", "jax_numpy_dtype_promotion")
VERSIONED = ("jax", "jaxlib", "flax", "optax")
MAX_BYTES = 2 << 30  # a store above this size drops its least recently used programs
LOAD_THREADS = 2  # background loads of a named block's programs
FORMAT = 3  # of a stored program's file: (payload, in_tree, out_tree, calls LAPACK,
            # C++ kernels it calls); in the key

# The open store: its directory, the executables in memory, the keys the block has used (in
# order) and the background loads not yet claimed (key: future).
_store = {"path": None, "loaded": {}, "used": [], "pending": {}}


@contextlib.contextmanager
def storing(path: str, name: str | None = None):
  """Within the block, `jit` functions keep their compiled programs in `path` (created).
  A store over MAX_BYTES (programs of earlier versions of the code pile up) first drops its
  least recently used programs down to half of it. With a `name`, the programs that the
  last block of that name used start loading at once, and a block that ends without an
  error lists its own for the next (module docstring)."""
  os.makedirs(path, exist_ok=True)
  _prune(path, MAX_BYTES)
  listing = None if name is None else os.path.join(
      path, hashlib.sha256(name.encode()).hexdigest() + ".programs")
  listed = _read_listing(listing)
  pool = ThreadPoolExecutor(LOAD_THREADS, thread_name_prefix="fedjax_rep-load")
  saved = dict(_store)
  _store.update(path=path, loaded={}, used=[],
                pending={key: pool.submit(_load, path, key) for key in listed})
  try:
    _store.update(environment=_environment())
    yield path
    if listing is not None and _store["used"] != listed:
      _write_listing(listing, _store["used"])
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
    _store.clear()
    _store.update(saved)


def _read_listing(listing: str | None) -> list[str]:
  """The keys listed in the file `listing` ([] if there is none or it cannot be read)."""
  if listing is None:
    return []
  try:
    with open(listing) as f:
      keys = json.load(f)
    return [key for key in keys if isinstance(key, str)] if isinstance(keys, list) else []
  except (OSError, ValueError):
    return []


def _write_listing(listing: str, keys: list[str]) -> None:
  """Writes `keys` to the file `listing`; one that cannot be written is skipped with a
  warning (the next run then loads its programs when it first calls them)."""
  data = json.dumps(keys).encode()
  try:
    files.atomic_write(listing, lambda f: f.write(data))
  except OSError as error:
    logging.warning("fedjax_rep: cannot list the stored programs in %s (%s)", listing, error)


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
  return repr((FORMAT, files.source_fingerprint(),
               [metadata.version(name) for name in VERSIONED],
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
      _store["used"].append(key)
      pending = _store["pending"].pop(key, None)
      compiled = pending.result() if pending is not None else _load(_store["path"], key)
    if compiled is None:
      with _persistent_cache_off():
        compiled = jitted.lower(*args, **kwargs).compile()
      _save(_store["path"], key, compiled)
    _store["loaded"][key] = compiled
    return compiled(*dynamic[0], **dynamic[1])

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
  arguments cannot be described by value (module docstring), or when it is called inside
  another trace (traced arguments: the plain jit inlines it into the outer program)."""
  leaves, treedef = jax.tree.flatten(dynamic)
  for leaf in leaves:
    if isinstance(leaf, jax.core.Tracer):
      return None
    if isinstance(leaf, jax.Array) and len(leaf.sharding.device_set) != 1:
      return None
  text = "\n".join([name, repr(sorted(static.items())), str(treedef),
                    repr([jax.typeof(leaf) for leaf in leaves]), _store["environment"]])
  if " at 0x" in text:
    return None
  return hashlib.sha256(text.encode()).hexdigest()


def _path(path: str, key: str) -> str:
  return os.path.join(path, f"{key}.executable")


_lapack_lock = threading.Lock()  # background loads may ask at the same time


def _initialize_lapack() -> None:
  """Makes jaxlib load its LAPACK kernels (0.02 s). jaxlib loads them when a program
  that calls LAPACK is lowered; a stored program is not, and calling its LAPACK custom calls
  before they are loaded crashes the process, so a stored program that calls LAPACK is
  loaded after this."""
  with _lapack_lock:
    _initialize_lapack_once()


@functools.cache
def _initialize_lapack_once() -> None:
  """jaxlib's own LAPACK initializer, after `_load_scipy_kernel_tables`; where a version
  lacks it, lowering a Cholesky does the same in 0.2 s."""
  _load_scipy_kernel_tables()
  try:
    from jax._src.lib import lapack
    lapack._lapack.initialize()
  except (ImportError, AttributeError):
    jax.jit(jnp.linalg.cholesky).lower(jax.ShapeDtypeStruct((1, 1), jnp.float32))


SCIPY_KERNEL_TABLES = ("scipy.linalg.cython_blas", "scipy.linalg.cython_lapack")  # jaxlib reads


def _load_scipy_kernel_tables() -> None:
  """Loads the extension modules scipy.linalg.cython_blas and cython_lapack, whose tables of
  BLAS and LAPACK functions jaxlib's LAPACK initializer reads, without running scipy.linalg's
  __init__ (0.02 s instead of 0.4-0.7 s of imports on a 2-core CPU, most of a warm run's
  wait for its first program). A later `import scipy.linalg` finds them in sys.modules; only
  the attribute `scipy.linalg.cython_blas` is then missing (`from scipy.linalg import
  cython_blas` works). Does nothing where scipy.linalg is imported already, and leaves the
  ordinary import to jaxlib where a module cannot be found or loaded."""
  if "scipy.linalg" in sys.modules:
    return
  try:
    folder = os.path.join(os.path.dirname(importlib.util.find_spec("scipy").origin), "linalg")
    for full in SCIPY_KERNEL_TABLES:
      if full in sys.modules:
        continue
      spec = importlib.machinery.PathFinder.find_spec(full, [folder])  # the parent unimported
      if spec is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[full] = module
  except (ImportError, AttributeError, OSError):
    return


def _load(path: str, key: str):
  """The executable of `key` stored in `path`, or None when there is none or it cannot be
  loaded (then it is compiled again and replaced)."""
  file = _path(path, key)
  try:
    with open(file, "rb") as f:
      payload, in_tree, out_tree, calls_lapack, kernels = pickle.load(f)
    if calls_lapack:
      _initialize_lapack()
    for name, library in kernels:  # its custom-call targets, registered before it runs
      native.load(name, library)
    compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
    os.utime(file)  # recently used: kept when the store is pruned
    return compiled
  except FileNotFoundError:
    return None
  except Exception as error:  # a damaged or foreign file: compile instead
    logging.warning("fedjax_rep: ignoring the stored program %s (%s)", file, error)
    return None


def _save(path: str, key: str, compiled) -> None:
  """Stores `compiled` under `key` in `path`; a store that cannot be written is skipped with
  a warning."""
  try:
    text = compiled.as_text()
    calls_lapack = "lapack_" in text  # custom calls to jaxlib's LAPACK kernels
    data = pickle.dumps((*serialize_executable.serialize(compiled), calls_lapack,
                         native.called(text)))
    files.atomic_write(_path(path, key), lambda f: f.write(data))
  except (OSError, pickle.PicklingError, TypeError, ValueError) as error:
    logging.warning("fedjax_rep: cannot store a compiled program in %s (%s)", path, error)
