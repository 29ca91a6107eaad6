"""Named experiments, one per paper figure or table: `registry` finds them (every module of
the subpackages here that calls `register`), `runner` runs them. `RECIPES` imports them all
(listing order)."""

from fedjax_rep.recipes import registry
from fedjax_rep.recipes.registry import get, resolve  # noqa: F401
from fedjax_rep.recipes.runner import run, run_to_dir  # noqa: F401


def __getattr__(name: str):
  if name == "RECIPES":
    return registry.all_recipes()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
