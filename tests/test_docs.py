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


DATE_OR_HASH = re.compile(
    r"\b20\d\d-\d\d-\d\d\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


def test_benchmarks_page_is_reference():
  """docs/benchmarks.md: at most 250 lines, dates and commit hashes only on the one
  "Measured on" line above each table."""
  lines = (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
  assert len(lines) <= 250
  assert [line for line in lines if DATE_OR_HASH.search(line)
          and not line.startswith("Measured on")] == []


def test_module_docstrings_say_what_the_module_computes_in_at_most_15_lines():
  """The story of a module (how it departs from the authors' code) lives in docs/papers;
  a package's __init__.py overview aside."""
  import ast
  long = {}
  for path in sorted((ROOT / "fedjax_rep").rglob("*.py")):
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    if doc and path.name != "__init__.py" and len(doc.splitlines()) > 15:
      long[str(path.relative_to(ROOT))] = len(doc.splitlines())
  assert long == {}


def test_every_fr_function_has_a_summary_line_args_and_returns():
  import inspect

  import fedjax_rep as fr
  missing = []
  for name in dir(fr):
    function = getattr(fr, name)
    if name.startswith("_") or not inspect.isfunction(function):
      continue
    doc = function.__doc__ or ""
    lines = doc.splitlines()
    summary = bool(lines) and lines[0].strip().endswith(".") and (
        len(lines) == 1 or not lines[1].strip())
    args = "Args:" in doc or not inspect.signature(function).parameters
    returns = "Returns:" in doc or "Yields:" in doc
    if not (summary and args and returns):
      missing.append(name)
  assert missing == []
