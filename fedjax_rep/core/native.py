"""C++ kernels behind XLA FFI custom calls, built on first use with the machine's compiler.

A kernel library is a C++ file of the package (`fedjax_rep/<...>/<library>.cc`) that
defines FFI handler symbols (XLA_FFI_DEFINE_HANDLER_SYMBOL) against the FFI headers jaxlib
ships (`jax.ffi.include_dir()`). The first call of `load(name, library)` on a machine
compiles it with $CXX (default `c++`, else `g++`) into $FEDJAX_REP_CACHE/native
(`compile_cache.default_dir`), under a name that covers the source, the jaxlib version, the
compiler command and the CPU's instruction set, so later processes (and other machines
sharing the directory) load their own build; its handler `name` is then registered as the
CPU custom-call target `name`.

Where there is no compiler, the build fails or FEDJAX_REP_NATIVE=0 is set, `load` says why
(`NativeUnavailable`) and callers use their XLA implementation instead.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading
import warnings

import jax
import jaxlib

from fedjax_rep.core import compile_cache

SWITCH = "FEDJAX_REP_NATIVE"  # "0": never build or load a kernel
COMPILER = "CXX"
FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC")
ARCH_FLAGS = (("-march=native",), ())  # tried in order
BUILD_SECONDS = 300
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_lock = threading.Lock()
_outcome = {}  # name: None (registered) or the NativeUnavailable raised
_libraries = {}  # name: the library it was registered from
_warned = set()


class NativeUnavailable(RuntimeError):
  """A kernel cannot be built or loaded here; the message says why and what to do."""


def source(library: str) -> str:
  """Path of kernel library `library`'s C++ source in the package."""
  for directory, _, names in os.walk(PACKAGE):
    if f"{library}.cc" in names:
      return os.path.join(directory, f"{library}.cc")
  raise NativeUnavailable(f"no C++ source {library}.cc in {PACKAGE}")


def compiler() -> str:
  """The C++ compiler: $CXX, else `c++` or `g++` on the PATH."""
  candidates = _candidates()
  for candidate in candidates:
    if shutil.which(candidate):
      return candidate
  raise NativeUnavailable(
      f"no C++ compiler found (tried {', '.join(candidates)}): install one (e.g. "
      f"`apt-get install g++`) or set {COMPILER}; until then the XLA implementation runs")


def _cpu_flags() -> str:
  """The CPU's instruction-set flags (Linux), else the processor's name."""
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.startswith(("flags", "Features"))),
                  platform.processor())
  except OSError:
    return platform.processor()


def _candidates() -> list[str]:
  return [os.environ[COMPILER]] if os.environ.get(COMPILER) else ["c++", "g++"]


def has_compiler() -> bool:
  """True if `compiler()` finds a C++ compiler."""
  return any(shutil.which(candidate) for candidate in _candidates())


def library_path(library: str) -> str:
  """Where kernel library `library` for this machine is (or will be) built."""
  with open(source(library), "rb") as f:
    digest = hashlib.sha256(f.read())
  for part in (jaxlib.__version__, compiler(), repr(FLAGS + ARCH_FLAGS), platform.machine(),
               _cpu_flags()):
    digest.update(b"\0" + part.encode())
  return os.path.join(compile_cache.default_dir(), "native",
                      f"{library}-{digest.hexdigest()[:16]}.so")


def build(library: str) -> str:
  """Compiles kernel library `library` into `library_path(library)` unless it is there;
  returns the path. Raises NativeUnavailable with the compiler's message when no flags
  build it."""
  path = library_path(library)
  if os.path.exists(path):
    return path
  os.makedirs(os.path.dirname(path), exist_ok=True)
  errors = []
  for arch in ARCH_FLAGS:
    command = [compiler(), *FLAGS, *arch, "-I", jax.ffi.include_dir(), source(library)]
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
      result = subprocess.run([*command, "-o", tmp], capture_output=True, text=True,
                              timeout=BUILD_SECONDS, check=False)
      if result.returncode == 0:
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)  # atomic: another process may be building the same file
        return path
      errors.append(f"{' '.join(command)}: {result.stderr.strip()[-2000:]}")
    except (OSError, subprocess.TimeoutExpired) as error:
      errors.append(f"{' '.join(command)}: {error}")
    finally:
      if os.path.exists(tmp):
        os.unlink(tmp)
  raise NativeUnavailable(f"cannot build the C++ kernel {library}:\n" + "\n".join(errors))


def disabled() -> bool:
  """True when FEDJAX_REP_NATIVE=0 (or false/no/off)."""
  return os.environ.get(SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def load(name: str, library: str | None = None) -> None:
  """Builds (once per machine) the kernel library `library` (default: `name`) and registers
  (once per process) its handler `name` as a CPU FFI target. Raises NativeUnavailable when
  it is disabled or cannot be built or loaded (a failure is remembered: the process does not
  try again)."""
  if disabled():
    raise NativeUnavailable(f"C++ kernels are switched off ({SWITCH}=0)")
  with _lock:
    if name not in _outcome:
      try:
        _register(name, library or name)
        _outcome[name] = None
        _libraries[name] = library or name
      except NativeUnavailable as error:
        _outcome[name] = error
    if _outcome[name] is not None:
      raise _outcome[name]


def _register(name: str, library: str) -> None:
  path = build(library)
  try:
    handler = getattr(ctypes.cdll.LoadLibrary(path), name)
  except (OSError, AttributeError) as error:
    raise NativeUnavailable(f"cannot load the C++ kernel {path} ({error}); delete it to "
                            f"build it again") from None
  jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler), platform="cpu")


def available(name: str, library: str | None = None) -> bool:
  """True if kernel `name` (of `library`) is loaded or can be (`load`); False otherwise, with
  the reason given once per process as a warning."""
  try:
    load(name, library)
    return True
  except NativeUnavailable as error:
    if name not in _warned:
      _warned.add(name)
      warnings.warn(f"{error}; running the XLA implementation instead", RuntimeWarning,
                    stacklevel=2)
    return False


def called(program_text: str) -> tuple[tuple[str, str], ...]:
  """(name, library) of the loaded kernels that a compiled program (its `as_text()`) calls."""
  return tuple((name, _libraries[name]) for name, error in _outcome.items()
               if error is None and f'custom_call_target="{name}"' in program_text)
