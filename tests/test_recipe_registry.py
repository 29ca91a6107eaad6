"""The recipe registry: a figure is one file (a module in a package of recipes, found without
any table), the README's recipe table is the registry's, and the recipes' configurations
share their common fields through base classes instead of repeating them."""

import ast
import dataclasses
import os
import pathlib
import runpy
import subprocess
import sys

import pytest

from fedjax_rep.experiments import recipe_registry

ROOT = pathlib.Path(__file__).resolve().parent.parent


def figure_module() -> str:
  """The recipe module of docs/api.md's "Adding a figure" (its first python block)."""
  text = (ROOT / "docs" / "api.md").read_text().split("### Adding a figure", 1)[1]
  return text.split("```python\n", 1)[1].split("```", 1)[0]


def _installed_package(root: pathlib.Path) -> dict:
  """A package `myfigs` with one recipe module, and the dist-info that names it under the
  entry-point group fedjax_rep.recipes (what `pip install` of a user's package with
  [project.entry-points."fedjax_rep.recipes"] myfigs = "myfigs" writes); the environment
  that puts `root` on the path."""
  (root / "myfigs").mkdir(parents=True)
  (root / "myfigs" / "__init__.py").write_text('"""A user\'s figures."""\n')
  (root / "myfigs" / "fig.py").write_text(figure_module())
  info = root / "myfigs-0.1.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myfigs\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text("[fedjax_rep.recipes]\nmyfigs = myfigs\n")
  path = os.pathsep.join([str(root), str(ROOT), os.environ.get("PYTHONPATH", "")])
  return {**os.environ, "PYTHONPATH": path}


def test_a_new_figure_is_one_module_found_by_list_and_run(tmp_path):
  env = _installed_package(tmp_path / "site")
  listed = subprocess.run([sys.executable, "-m", "fedjax_rep", "list"], env=env,
                          capture_output=True, text=True, timeout=300)
  assert listed.returncode == 0, listed.stderr
  recipes = listed.stdout.split("linear algorithms:")[0].splitlines()
  assert recipes[-1].split() == ["my-fig", "running", "mean", "of", "N(0,", "1)",
                                 "draws"]  # after the built-in ones
  out = tmp_path / "out"
  ran = subprocess.run([sys.executable, "-m", "fedjax_rep", "run", "my-fig", "--quick",
                        "--no-progress", "--out", str(out)], env=env, capture_output=True,
                       text=True, timeout=300)
  assert ran.returncode == 0, ran.stderr
  rows = (out / "metrics.csv").read_text().splitlines()
  assert rows[0] == "algorithm,seed,round,running_mean" and len(rows) == 1 + 5
  assert (out / "my-fig.png").stat().st_size > 0


def test_a_recipe_module_that_raises_is_one_line(tmp_path):
  env = _installed_package(tmp_path / "site")
  (tmp_path / "site" / "myfigs" / "broken.py").write_text("import numpy\n1 / 0\n")
  listed = subprocess.run([sys.executable, "-m", "fedjax_rep", "list"], env=env,
                          capture_output=True, text=True, timeout=300)
  assert listed.returncode == 2 and listed.stderr.count("\n") == 1, listed.stderr
  assert listed.stderr.startswith("fedjax-rep: error: recipe module myfigs.broken raised "
                                  "ZeroDivisionError while importing: division by zero")


def test_list_is_unchanged_without_the_package():
  """Built-in recipes only: 24, in their listing order."""
  names = list(recipe_registry.all_recipes())
  assert names[:3] == ["fedrep-fig1", "fedrep-fig3", "fedrep-fig4"]
  assert names[-2:] == ["flute-table1", "srpfl-neural"] and len(names) == 24


def test_a_recipe_is_found_by_the_module_its_name_spells():
  assert recipe_registry._spelled_modules("fedavg-ft-fig1")[0] == \
      "fedjax_rep.recipes.fedavg_ft.fig1"
  assert recipe_registry._spelled_modules("fedrep-table1-cifar10")[0] == \
      "fedjax_rep.recipes.fedrep.table1"
  assert recipe_registry._spelled_modules("no-such-recipe") == []


def test_readme_recipe_table_is_the_registry_s():
  script = runpy.run_path(str(ROOT / "scripts" / "recipe_table.py"))
  readme = (ROOT / "README.md").read_text()
  assert script["with_table"](readme, recipe_registry.all_recipes()) == readme, (
      "README.md's recipe table is not the registry's: run python scripts/recipe_table.py")
  for recipe in recipe_registry.all_recipes().values():
    assert (ROOT / recipe.docs.split("#")[0]).is_file(), (recipe.name, recipe.docs)


def _field_lines(tree: ast.Module, source: str) -> list[list[str]]:
  """The field declarations (source lines, whitespace collapsed) of each dataclass of a
  module, one list per class."""
  blocks = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ClassDef):
      fields = [" ".join(ast.get_source_segment(source, item).split())
                for item in node.body if isinstance(item, ast.AnnAssign)]
      if fields:
        blocks.append(fields)
  return blocks


def test_no_config_field_block_is_repeated_across_recipe_modules():
  """No two consecutive field declarations of one configuration class appear, in the same
  order, in another class of the recipes: shared fields live in a shared base class."""
  seen = {}
  for path in sorted((ROOT / "fedjax_rep" / "recipes").rglob("*.py")):
    source = path.read_text()
    for index, fields in enumerate(_field_lines(ast.parse(source), source)):
      for pair in zip(fields, fields[1:]):
        where = f"{path.relative_to(ROOT)} (class {index})"
        assert seen.setdefault(pair, where) == where, (
            f"{pair} is declared in {seen[pair]} and again in {where}")


def test_a_recipe_whose_configuration_is_not_a_config_is_refused():
  """Every recipe's configuration derives from `experiments.config.Config` (its neutral
  methods are what shared code calls)."""


  @dataclasses.dataclass(frozen=True)
  class Plain:
    rounds: int = 2

  with pytest.raises(ValueError, match=r"recipe test-plain: its configuration Plain does not "
                                       r"derive from fedjax_rep.experiments.config.Config"):
    recipe_registry.register(recipe_registry.Recipe(name="test-plain", summary="", config=Plain,
                                                    quick={}, run=None, plot=None))
  assert "test-plain" not in recipe_registry.RECIPES
