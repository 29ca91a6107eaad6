"""Building and loading the C++ kernel libraries of `fedjax_rep.native`.

A kernel library is a C++ file of this package (`fedjax_rep/native/<library>.cc`) that
defines FFI handler symbols (XLA_FFI_DEFINE_HANDLER_SYMBOL) against the FFI headers jaxlib
ships (`jax.ffi.include_dir()`). `load(name, library)` compiles it with $CXX (default `c++`,
else `g++`) into $FEDJAX_REP_CACHE/native (`compile_cache.default_dir`) unless that build is
there, under the file name `build_key(library)`: it covers the source, the jaxlib version,
the compiler command and the CPU's instruction set, so later processes (and other machines
sharing the directory) load their own build. The handler `name` is then registered as the
CPU custom-call target `name`. Only `build` (through `load`) runs the compiler.

Where there is no compiler or the build fails, `load` raises NativeUnavailable saying why.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading

import jax
import jaxlib

from fedjax_rep.core import compile_cache

COMPILER = "CXX"
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")
ARCH_FLAGS = (("-march=native",), ())  # tried in order
BUILD_SECONDS = 300
DIRECTORY = os.path.dirname(os.path.abspath(__file__))

_lock = threading.Lock()
_registered = set()  # the handler names registered in this process


class NativeUnavailable(RuntimeError):
  """A kernel cannot be built or loaded here; the message says why and what to do."""


def source(library: str) -> str:
  """Path of kernel library `library`'s C++ source in this package."""
  path = os.path.join(DIRECTORY, f"{library}.cc")
  if not os.path.exists(path):
    raise NativeUnavailable(f"no C++ source {library}.cc in {DIRECTORY}")
  return path


def _candidates() -> list[str]:
  return [os.environ[COMPILER]] if os.environ.get(COMPILER) else ["c++", "g++"]


def compiler() -> str:
  """The C++ compiler: $CXX, else `c++` or `g++` on the PATH."""
  candidates = _candidates()
  for candidate in candidates:
    if shutil.which(candidate):
      return candidate
  raise NativeUnavailable(
      f"no C++ compiler found (tried {', '.join(candidates)}): install one (e.g. "
      f"`apt-get install g++`) or set {COMPILER}")


def has_compiler() -> bool:
  """True if `compiler()` finds a C++ compiler."""
  return any(shutil.which(candidate) for candidate in _candidates())


def _cpu_flags() -> str:
  """The CPU's instruction-set flags (Linux), else the processor's name."""
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.startswith(("flags", "Features"))),
                  platform.processor())
  except OSError:
    return platform.processor()


def build_key(library: str) -> str:
  """The file name ("<library>-<16 hex digits>.so") that kernel library `library` is built
  under on this machine: a hash of its source, the jaxlib version, the compiler command, the
  flags and the CPU's instruction set. Computed without building; NativeUnavailable where
  there is no compiler."""
  with open(source(library), "rb") as f:
    digest = hashlib.sha256(f.read())
  for part in (jaxlib.__version__, compiler(), repr(FLAGS + ARCH_FLAGS), platform.machine(),
               _cpu_flags()):
    digest.update(b"\0" + part.encode())
  return f"{library}-{digest.hexdigest()[:16]}.so"


def library_path(library: str) -> str:
  """Where kernel library `library` for this machine is (or will be) built."""
  return os.path.join(compile_cache.default_dir(), "native", build_key(library))


def _first_error(output: str) -> str:
  """The compiler output's first line that mentions an error, else its last line."""
  lines = [line.strip() for line in output.splitlines() if line.strip()]
  line = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else "")
  return line[:300] or "no output"


def build(library: str) -> str:
  """Compiles kernel library `library` into `library_path(library)` unless it is there;
  returns the path. Raises NativeUnavailable (one line: each try's compiler, flags, exit
  status and first error) when no flags build it."""
  path = library_path(library)
  if os.path.exists(path):
    return path
  os.makedirs(os.path.dirname(path), exist_ok=True)
  cxx, errors = compiler(), []
  for arch in ARCH_FLAGS:
    command = [cxx, *FLAGS, *arch, "-I", jax.ffi.include_dir(), source(library)]
    tried = " ".join([cxx, *FLAGS, *arch])
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
      result = subprocess.run([*command, "-o", tmp], capture_output=True, text=True,
                              timeout=BUILD_SECONDS, check=False)
      if result.returncode == 0:
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)  # atomic: another process may be building the same file
        return path
      errors.append(f"`{tried}` exited {result.returncode} ({_first_error(result.stderr)})")
    except (OSError, subprocess.TimeoutExpired) as error:
      errors.append(f"`{tried}` failed ({error})")
    finally:
      if os.path.exists(tmp):
        os.unlink(tmp)
  raise NativeUnavailable(f"cannot build the C++ kernel {library}: {'; '.join(errors)}")


def load(name: str, library: str) -> None:
  """Builds (once per machine) kernel library `library` and registers (once per process)
  its handler `name` as a CPU FFI target. Raises NativeUnavailable when it cannot be built
  or loaded (a later call tries again)."""
  with _lock:
    if name in _registered:
      return
    path = build(library)
    try:
      handler = getattr(ctypes.cdll.LoadLibrary(path), name)
    except (OSError, AttributeError) as error:
      raise NativeUnavailable(f"cannot load the C++ kernel {path} ({error}); delete it to "
                              f"build it again") from None
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler), platform="cpu")
    _registered.add(name)
