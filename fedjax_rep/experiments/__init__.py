"""The machinery of named experiments (recipes): `registry` finds them (every module of
the subpackages of `fedjax_rep.recipes` that calls `register`), `config` checks their
configurations, `runner` runs them into `outputs`. `RECIPES` imports them all (listing
order)."""

from fedjax_rep.experiments import registry
from fedjax_rep.experiments.registry import get, resolve  # noqa: F401
from fedjax_rep.experiments.runner import run, run_to_dir  # noqa: F401


def __getattr__(name: str):
  if name == "RECIPES":
    return registry.all_recipes()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
