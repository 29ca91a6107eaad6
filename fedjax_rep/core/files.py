"""Files written whole, and what identifies the package's code: the fingerprint of its
source files and the git revision it came from."""

import hashlib
import os
import subprocess
import uuid

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REVISION_FILE = os.path.join(PACKAGE, "REVISION")  # written by the build (setup.py)


class WriteError(OSError):
  """A file or checkpoint of a run could not be written (e.g. the disk is full); the text
  names it and says why."""

  def __init__(self, path: str, error: OSError):
    super().__init__(error.errno, error.strerror or str(error), path)

  def __str__(self) -> str:
    return f"cannot write {self.filename} ({self.strerror})"


def atomic_write(path: str, write) -> None:
  """Calls write(file) on a temporary file beside `path`, then renames it onto `path`: the
  file is there whole or not at all (what was there before stays as it was). The file is
  created with mode 0666 less the user's umask, like any file a program writes. WriteError
  when it cannot be written."""
  directory = os.path.dirname(os.path.abspath(path))
  tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(path)}")
  try:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
      with os.fdopen(fd, "wb") as f:
        write(f)
      os.replace(tmp, path)
    except BaseException:
      if os.path.exists(tmp):
        os.unlink(tmp)
      raise
  except OSError as error:
    raise WriteError(path, error) from error


def source_fingerprint() -> str:
  """sha256 of the package's Python and C++ sources (paths and contents): the code that
  wrote a run."""
  digest = hashlib.sha256()
  for directory, subdirs, files in sorted(os.walk(PACKAGE)):
    subdirs.sort()
    for name in sorted(f for f in files if f.endswith((".py", ".cc"))):
      path = os.path.join(directory, name)
      digest.update(os.path.relpath(path, PACKAGE).encode() + b"\0")
      with open(path, "rb") as f:
        digest.update(f.read() + b"\0")
  return digest.hexdigest()


def git_revision(directory: str) -> str:
  """The commit of the git checkout holding `directory` ('+' when the files under it differ
  from the commit), or 'unknown' where there is none or git cannot say."""
  try:
    head = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True,
                          text=True, timeout=10)
    dirty = subprocess.run(["git", "-C", directory, "status", "--porcelain", "--", "."],
                           capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.TimeoutExpired):
    return "unknown"
  if head.returncode or dirty.returncode:
    return "unknown"
  return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def revision() -> str:
  """The git revision of the package's code: the one recorded when it was built (an
  installed copy, `pip install .`), else that of the checkout it runs from (an editable
  install), else 'unknown'."""
  if os.path.exists(REVISION_FILE):
    with open(REVISION_FILE) as f:
      return f.read().strip() or "unknown"
  return git_revision(PACKAGE)
