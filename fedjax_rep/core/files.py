"""Files written whole, and the fingerprint of the package's own source files."""

import hashlib
import os
import uuid


def atomic_write(path: str, write) -> None:
  """Calls write(file) on a temporary file beside `path`, then renames it onto `path`. The
  file is created with mode 0666 less the user's umask, like any file a program writes."""
  directory = os.path.dirname(os.path.abspath(path))
  tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(path)}")
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def source_fingerprint() -> str:
  """sha256 of the package's Python and C++ sources (paths and contents): the code that
  wrote a run."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digest = hashlib.sha256()
  for directory, subdirs, files in sorted(os.walk(root)):
    subdirs.sort()
    for name in sorted(f for f in files if f.endswith((".py", ".cc"))):
      path = os.path.join(directory, name)
      digest.update(os.path.relpath(path, root).encode() + b"\0")
      with open(path, "rb") as f:
        digest.update(f.read() + b"\0")
  return digest.hexdigest()
