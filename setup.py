"""Build step (the rest of the build is in pyproject.toml): an installed copy of the package
carries the git revision of the checkout it was built from in fedjax_rep/REVISION, which
every run's config.json records (`fedjax_rep.core.files.revision`)."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fedjax_rep.core import files  # noqa: E402  (the source tree's; imports only the stdlib)


class BuildWithRevision(build_py):
  """build_py, then fedjax_rep/REVISION in the built package."""

  def run(self):
    super().run()
    with open(os.path.join(self.build_lib, "fedjax_rep", "REVISION"), "w") as f:
      f.write(files.git_revision(os.path.join(HERE, "fedjax_rep")) + "\n")


setup(cmdclass={"build_py": BuildWithRevision})
