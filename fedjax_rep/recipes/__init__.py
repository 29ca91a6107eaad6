"""Named experiments (one per paper figure), each registered by the module that defines it
(`registry.MODULES`). `get(name)` and `run(name, ...)` import only that module, so running
a linear recipe never imports flax.linen; `RECIPES` imports them all (listing order)."""

from fedjax_rep.recipes import registry
from fedjax_rep.recipes.registry import get, resolve, run, run_to_dir  # noqa: F401


def __getattr__(name: str):
  if name == "RECIPES":
    return registry.all_recipes()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
