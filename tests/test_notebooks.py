"""Notebooks run through the public API; executed here in quick mode (marked slow). The
committed notebooks carry the outputs of their full run (scripts/run_notebooks.py), checked
here without running anything."""

import ast
import copy
import glob
import os
import runpy

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = os.path.join(os.path.dirname(__file__), "..")
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
RUN_NOTEBOOKS = runpy.run_path(os.path.join(ROOT, "scripts", "run_notebooks.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes_in_quick_mode(path, monkeypatch, tmp_path):
  """Runs a copy in memory: the committed file and its outputs stay as they are."""
  nbclient = pytest.importorskip("nbclient")
  monkeypatch.setenv("FEDJAX_REP_QUICK", "1")
  RUN_NOTEBOOKS["write_kernel_spec"](str(tmp_path / "jupyter"))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
  notebook = nbformat.read(path, as_version=4)
  client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                   resources={"metadata": {"path": str(tmp_path)}})
  client.execute()


# A call draws a figure if it is matplotlib.pyplot's (`plt.subplots`, `plt.show`), a drawing
# method (`ax.plot`, a recipe's `.plot(rows, config, file)`, `ax.imshow`, ...), an
# IPython `Image(...)`, or a function the notebook defined earlier whose body draws
# (`show_recipe`). A cell draws if one of its statements outside a `def` makes such a call:
# a cell that only defines a drawing helper has no figure of its own.
DRAWING_METHODS = {"plot", "imshow", "matshow", "hist", "bar", "scatter", "savefig"}


def _root(node):
  while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
    node = node.func if isinstance(node, ast.Call) else node.value
  return node.id if isinstance(node, ast.Name) else None


def _draws(nodes, helpers) -> bool:
  """Whether the statements `nodes` (not the bodies of the functions they define) draw."""
  pending = list(nodes)
  while pending:
    node = pending.pop()
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
      continue
    if isinstance(node, ast.Call):
      func = node.func
      if _root(func) == "plt":
        return True
      if isinstance(func, ast.Attribute) and func.attr in DRAWING_METHODS:
        return True
      if isinstance(func, ast.Name) and (func.id == "Image" or func.id in helpers):
        return True
    pending.extend(ast.iter_child_nodes(node))
  return False


def drawing_cells(notebook) -> list[int]:
  """The indices of the code cells that draw a figure (the rule above)."""
  helpers, cells = set(), []
  for index, cell in enumerate(notebook.cells):
    if cell.cell_type != "code":
      continue
    tree = ast.parse(cell.source)  # no IPython magics in these notebooks
    for node in tree.body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _draws(node.body, helpers):
        helpers.add(node.name)
    if _draws(tree.body, helpers):
      cells.append(index)
  return cells


def missing_outputs(notebook) -> list[str]:
  """What keeps `notebook` from being a finished run: code cells never executed or with an
  error, drawing cells without a PNG image."""
  problems = []
  for index, cell in enumerate(notebook.cells):
    if cell.cell_type != "code":
      continue
    if cell.execution_count is None:
      problems.append(f"cell {index}: not executed")
    if any(output.output_type == "error" for output in cell.outputs):
      problems.append(f"cell {index}: an error")
  for index in drawing_cells(notebook):
    if not any("image/png" in output.get("data", {}) for output in notebook.cells[index].outputs):
      problems.append(f"cell {index}: draws, but has no image/png output")
  return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_committed_with_its_full_run_outputs(path):
  """Every code cell ran, every drawing cell has its figure, in full mode (the first code
  cell prints the mode). Run `python scripts/run_notebooks.py NAME` to make them."""
  notebook = nbformat.read(path, as_version=4)
  assert drawing_cells(notebook), "the rule finds no drawing cell"
  assert missing_outputs(notebook) == []
  printed = "".join(output.get("text", "") for cell in notebook.cells
                    if cell.cell_type == "code" for output in cell.outputs)
  assert "full mode" in printed and "QUICK mode" not in printed


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_missing_outputs_are_found(path):
  """The check above fails on the same notebook without its outputs, and on one whose
  cells ran but whose figures were dropped: then exactly the drawing cells are named."""
  notebook = nbformat.read(path, as_version=4)
  bare = copy.deepcopy(notebook)
  for cell in bare.cells:
    if cell.cell_type == "code":
      cell.outputs, cell.execution_count = [], None
  code = [i for i, cell in enumerate(bare.cells) if cell.cell_type == "code"]
  assert len(missing_outputs(bare)) == len(code) + len(drawing_cells(bare))

  no_figures = copy.deepcopy(notebook)
  for cell in no_figures.cells:
    if cell.cell_type == "code":
      cell.execution_count = cell.execution_count or 1
      cell.outputs = [o for o in cell.outputs if "image/png" not in o.get("data", {})]
  assert missing_outputs(no_figures) == [f"cell {i}: draws, but has no image/png output"
                                         for i in drawing_cells(no_figures)]
