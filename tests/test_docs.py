"""The docs run: every ```python block of README.md and docs/**/*.md is executed as written,
each in a fresh interpreter (a block that stops working fails here)."""

import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest

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


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


BLOCKS = python_blocks()


def test_the_docs_have_python_blocks():
  assert len(BLOCKS) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("where,code", BLOCKS, ids=[where for where, _ in BLOCKS])
def test_python_block_runs_as_written(where, code, tmp_path):
  """A multi-host example (it reads NUM_PROCESSES) runs as two processes on this machine."""
  processes = 2 if "NUM_PROCESSES" in code else 1
  env = {**os.environ, "NUM_PROCESSES": str(processes),
         "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}", "JAX_PLATFORMS": "cpu"}
  logs = [tmp_path / f"stderr-{i}.txt" for i in range(processes)]
  runs = []
  for i, log in enumerate(logs):
    with log.open("w") as stderr:  # the child keeps its own copy of the descriptor
      runs.append(subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path,
                                   env={**env, "PROCESS_ID": str(i)},
                                   stdout=subprocess.DEVNULL, stderr=stderr))
  for i, (run, log) in enumerate(zip(runs, logs)):
    run.wait(timeout=600)
    assert run.returncode == 0, (f"{where} (process {i} of {processes}) failed:\n"
                                 f"{log.read_text()[-3000:]}")
