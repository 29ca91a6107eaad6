"""The docs run: every ```python block of README.md and docs/**/*.md is executed as written,
each in a fresh interpreter (a block that stops working fails here)."""

import pathlib
import re
import sys

import pytest

from conftest import Job

ROOT = pathlib.Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.M | re.S)


def python_blocks() -> list[tuple[str, str]]:
  """(id, code) of every python block in README.md and docs/, indentation removed."""
  pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
  blocks = []
  for page in pages:
    if not page.exists():
      continue
    text = page.read_text()
    for match in BLOCK.finditer(text):
      line = text[:match.start()].count("\n") + 1
      indent = len(match.group(1))
      code = "\n".join(row[indent:] for row in match.group(2).splitlines())
      blocks.append((f"{page.relative_to(ROOT)}:{line}", code))
  return blocks


BLOCKS = python_blocks()


def test_the_docs_have_python_blocks():
  assert len(BLOCKS) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("where,code", BLOCKS, ids=[where for where, _ in BLOCKS])
def test_python_block_runs_as_written(where, code, tmp_path):
  """A multi-host example (it reads NUM_PROCESSES) runs as two processes on this machine."""
  processes = 2 if "NUM_PROCESSES" in code else 1
  with Job([sys.executable, "-c", code], processes, 1, str(tmp_path)) as job:
    codes = job.wait(timeout=600)
    for i, returncode in enumerate(codes):
      assert returncode == 0, f"{where} (process {i} of {processes}) failed:\n{job.log(i)}"
