"""config.json's record of the code: the git revision, from the checkout or recorded by the
build of an installed copy (setup.py)."""

import os
import subprocess
import sys

from fedjax_rep.core import files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git(directory, *args):
  return subprocess.run(["git", "-C", str(directory), *args], check=True, capture_output=True,
                        text=True).stdout.strip()


def test_git_revision_names_the_commit_and_marks_changes(tmp_path):
  assert files.git_revision(str(tmp_path)) == "unknown"  # not a checkout
  git(tmp_path, "init", "-q")
  (tmp_path / "a.py").write_text("x = 1\n")
  git(tmp_path, "add", "a.py")
  git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
  head = git(tmp_path, "rev-parse", "HEAD")
  assert files.git_revision(str(tmp_path)) == head
  (tmp_path / "a.py").write_text("x = 2\n")
  assert files.git_revision(str(tmp_path)) == head + "+"


def test_revision_reads_the_file_the_build_wrote(tmp_path, monkeypatch):
  recorded = tmp_path / "REVISION"
  recorded.write_text("0123abcd\n")
  monkeypatch.setattr(files, "REVISION_FILE", str(recorded))
  assert files.revision() == "0123abcd"


def test_the_build_records_the_checkouts_revision(tmp_path):
  """setup.py's build_py writes fedjax_rep/REVISION into the built package: what a copy
  installed with `pip install .` from a git clone reports."""
  subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
                 cwd=ROOT, check=True, capture_output=True)
  recorded = (tmp_path / "fedjax_rep" / "REVISION").read_text().strip()
  assert recorded == files.git_revision(os.path.join(ROOT, "fedjax_rep"))
