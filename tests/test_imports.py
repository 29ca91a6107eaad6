"""What importing costs: the command line runs a linear recipe without flax or optax, and
the flat API (`fr.X`) loads on first use, whole."""

import ast
import importlib
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

import fedjax_rep
from fedjax_rep.core import struct
from fedjax_rep.core import tree

LINEAR_RUN = """
import json, sys
from fedjax_rep import cli
code = cli.main(["run", "fedrep-fig3", "--quick", "--no-progress", "--no-compile-cache",
                 "--out", sys.argv[1]])
print(json.dumps({"code": code, "modules": sorted(
    name for name in ("flax", "optax", "chex", "fedjax_rep.api", "fedjax_rep.nn",
                      "fedjax_rep.recipes.srpfl.neural", "tensorboardX", "tensorboard",
                      "mlflow", "sqlalchemy") if name in sys.modules)}))
"""

FLAT_API = """
import json, sys
import fedjax_rep as fr
before = "fedjax_rep.api" in sys.modules
from fedjax_rep import FedRep
try:
  fr.no_such_name
  missing = None
except AttributeError as error:
  missing = str(error)
print(json.dumps({"before": before, "fedrep": FedRep.__module__,
                  "problem": fr.linear.problem.__name__, "recipes": len(fr.RECIPES),
                  "in_dir": "make_problem" in dir(fr), "neural": "neural" in fr.ALGORITHMS
                  and "fedrep" in fr.ALGORITHMS["neural"], "missing": missing}))
"""


def _child(script: str, *args) -> dict:
  done = subprocess.run([sys.executable, "-c", script, *args], check=True,
                        capture_output=True, text=True)
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # the fast tier keeps test_layers.py's import graph, read from the source
def test_linear_recipe_imports_no_flax_optax_neural_code_or_trackers(tmp_path):
  result = _child(LINEAR_RUN, str(tmp_path / "run"))
  assert result == {"code": 0, "modules": []}
  assert (tmp_path / "run" / "metrics.csv").stat().st_size > 0


def test_flat_api_loads_whole_on_first_attribute():
  result = _child(FLAT_API)
  assert result["before"] is False  # `import fedjax_rep` alone loads nothing
  assert result["fedrep"] == "fedjax_rep.linear.fedrep"
  assert result["problem"] == "fedjax_rep.linear.problem"
  assert result["recipes"] >= 16 and result["in_dir"] and result["neural"]
  assert "no attribute 'no_such_name'" in result["missing"]


def test_struct_dataclass_is_a_pytree_with_static_fields_and_replace():
  @struct.dataclass
  class Point:
    x: jax.Array
    label: str = struct.static_field(default="a")

  point = Point(np.float32(1.0))
  assert jax.tree.leaves(point) == [1.0]
  assert jax.tree.map(lambda v: v + 1, point) == Point(np.float32(2.0))
  assert point.replace(label="b").label == "b" and point.label == "a"
  traces = []

  @jax.jit
  def double(p):
    traces.append(p.label)
    return p.replace(x=2 * p.x)

  assert double(point).x == 2.0 and double(Point(np.float32(3.0))).x == 6.0
  double(point.replace(label="b"))
  assert traces == ["a", "b"]  # a static field is part of the program's key


def test_flatten_unflatten_round_trip():
  nested = {"body": {"conv1": {"kernel": 1, "bias": 2}, "fc": {"w": 3}}, "head": {"b": 4},
            "empty": {}}
  flat = tree.flatten(nested)
  assert list(flat.items()) == [("body/conv1/kernel", 1), ("body/conv1/bias", 2),
                                ("body/fc/w", 3), ("head/b", 4)]
  assert tree.unflatten(flat) == {key: value for key, value in nested.items() if value}


PAPERS = ("fedrep", "fedavg_ft", "flute", "srpfl", "digits")


def _imported_modules(path) -> set[str]:
  """The absolute names a module imports (`import a.b`, `from a.b import c`: a.b and a.b.c)."""
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def test_each_paper_package_imports_and_uses_no_other_papers_package():
  recipes = pathlib.Path(fedjax_rep.__file__).parent / "recipes"
  for paper in PAPERS:
    importlib.import_module(f"fedjax_rep.recipes.{paper}")
  for path in recipes.rglob("*.py"):
    own = path.parent.name if path.parent != recipes else None
    for name in _imported_modules(path):
      parts = name.split(".")
      if parts[:2] == ["fedjax_rep", "recipes"] and len(parts) > 2 and parts[2] in PAPERS:
        assert parts[2] == own, f"{path.relative_to(recipes)} imports {name}"
