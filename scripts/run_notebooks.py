"""Runs the notebooks in full mode and saves them, in place, with their outputs.

  python scripts/run_notebooks.py [NOTEBOOK ...] [--timeout SECONDS]

Without arguments every notebooks/*.ipynb runs; a NOTEBOOK is a path or the start of a
name in notebooks/ (`01`, `03_flute`). Each runs top to bottom in a fresh kernel of this
interpreter (nbclient), in notebooks/, importing this checkout's `fedjax_rep` (its root
goes first on the kernel's PYTHONPATH), in full mode: FEDJAX_REP_QUICK, which the tests
set for their shrunk runs, is removed from the kernel's environment. A notebook is written
back only when every cell ran without an error; the others are left as they were.

What is saved: the cells' outputs and execution counts, figures as PNG (matplotlib's
inline backend at its default 100 dpi; the recipes' figures at their own 120 dpi), each
re-encoded with a palette of 256 colours (a third of the size of matplotlib's RGBA PNGs,
alike to the eye: a figure has few colours beyond its lines' antialiasing). Nothing
that changes from one run to the next besides the outputs themselves: no execution
timestamps (record_timing off), the notebook's metadata stays as committed (the kernel's
Python version is not recorded), and a cell's consecutive printed lines are one output
however the kernel happened to send them. Re-running gives a diff in the numbers that do
change (timings) and nothing else.

Needs the `notebooks` or `test` extra (nbclient, nbformat, ipykernel):
pip install '.[notebooks]'.
"""

import argparse
import base64
import copy
import glob
import io
import json
import os
import sys
import tempfile
import time

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")


def resolve(names: list[str]) -> list[str]:
  """The notebook paths `names` stand for (all of notebooks/ if none)."""
  if not names:
    return sorted(glob.glob(os.path.join(NOTEBOOKS, "*.ipynb")))
  paths = []
  for name in names:
    if os.path.isfile(name):
      paths.append(os.path.abspath(name))
      continue
    matches = sorted(glob.glob(os.path.join(NOTEBOOKS, glob.escape(name) + "*.ipynb")))
    if len(matches) != 1:
      raise SystemExit(f"{name!r} names {len(matches)} notebooks in {NOTEBOOKS}: "
                       + (", ".join(os.path.basename(m) for m in matches) or "none"))
    paths.append(matches[0])
  return paths


def write_kernel_spec(spec_root: str) -> None:
  """Writes spec_root/kernels/python3/kernel.json: a "python3" kernel of this interpreter,
  which JUPYTER_PATH=spec_root puts ahead of any user-level one."""
  spec_dir = os.path.join(spec_root, "kernels", "python3")
  os.makedirs(spec_dir)
  with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
    json.dump({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
               "display_name": "Python 3", "language": "python"}, f)


def kernel_environment(spec_root: str) -> None:
  """Sets os.environ (which the kernels inherit) for a full run of this checkout: the
  kernel spec of `write_kernel_spec` found first (JUPYTER_PATH); this checkout first on
  PYTHONPATH; no FEDJAX_REP_QUICK; matplotlib's inline backend even where MPLBACKEND names
  another."""
  write_kernel_spec(spec_root)
  os.environ["JUPYTER_PATH"] = os.pathsep.join(
      [spec_root] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p])
  os.environ["PYTHONPATH"] = os.pathsep.join(
      [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
  os.environ.pop("FEDJAX_REP_QUICK", None)
  os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"


def coalesce_streams(notebook) -> None:
  """Merges each run of consecutive stream outputs of one name (stdout, stderr) into one:
  how a cell's printing is cut into messages depends on when the kernel flushes, not on
  what it prints. (nbclient's own coalesce_streams would also move text past figures.)"""
  for cell in notebook.cells:
    if cell.cell_type != "code":
      continue
    outputs = []
    for output in cell.outputs:
      previous = outputs[-1] if outputs else None
      if (output.output_type == "stream" and previous is not None
          and previous.output_type == "stream" and previous.name == output.name):
        previous.text += output.text
      else:
        outputs.append(output)
    cell.outputs = outputs


def shrink_images(notebook) -> None:
  """Re-encodes every PNG output as a 256-colour palette PNG on white, where that is
  smaller (median cut: the same pixels give the same bytes)."""
  from PIL import Image  # matplotlib's dependency
  for cell in notebook.cells:
    for output in cell.get("outputs", []):
      data = output.get("data", {})
      if "image/png" not in data:
        continue
      original = base64.b64decode(data["image/png"])
      image = Image.open(io.BytesIO(original)).convert("RGBA")
      image = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image)
      buffer = io.BytesIO()
      image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(
          buffer, format="PNG", optimize=True)
      if len(buffer.getvalue()) < len(original):
        data["image/png"] = base64.b64encode(buffer.getvalue()).decode("ascii")


def images(notebook) -> int:
  """The number of PNG images among the notebook's outputs."""
  return sum("image/png" in output.get("data", {})
             for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs)


def run(path: str, timeout: int) -> tuple[float, int]:
  """Runs the notebook at `path` and writes it back with its outputs; (seconds, images)."""
  notebook = nbformat.read(path, as_version=4)
  metadata = copy.deepcopy(notebook.metadata)
  client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                          record_timing=False, resources={"metadata": {"path": NOTEBOOKS}})
  start = time.perf_counter()
  client.execute()
  seconds = time.perf_counter() - start
  notebook.metadata = metadata  # not the kernel's language_info (its Python version)
  coalesce_streams(notebook)
  shrink_images(notebook)
  nbformat.write(notebook, path)
  return seconds, images(notebook)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("notebooks", nargs="*", metavar="NOTEBOOK",
                      help="a path or the start of a name in notebooks/ (default: all)")
  parser.add_argument("--timeout", type=int, default=3600,
                      help="seconds one cell may run (default 3600)")
  args = parser.parse_args(argv)
  paths = resolve(args.notebooks)
  failed = []
  with tempfile.TemporaryDirectory(prefix="run-notebooks-") as spec_root:
    kernel_environment(spec_root)
    for path in paths:
      name = os.path.relpath(path, ROOT)
      print(f"{name}: running", flush=True)
      try:
        seconds, count = run(path, args.timeout)
      except Exception as error:  # a cell's error (CellExecutionError), a timeout, ...
        print(f"{name}: FAILED, left unchanged\n{error}", flush=True)
        failed.append(name)
        continue
      print(f"{name}: {seconds:.0f} s, {count} images, {os.path.getsize(path) / 1024:.0f} KiB",
            flush=True)
  if failed:
    print("failed:", ", ".join(failed))
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
