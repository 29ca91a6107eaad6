"""Named experiments: registry, configuration resolution and running with outputs."""

import dataclasses
import datetime
import os
from typing import Callable

from fedjax_rep.recipes import config as cfg
from fedjax_rep.recipes import outputs


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A named experiment.

  run(config, seeds, unit, progress) -> rows (list of dicts, one per algorithm x seed x round);
  `unit(name, compute)` caches a unit of work (see outputs.RunDir.unit).
  plot(rows, config, path) draws the paper-style figure into `path` (PNG).
  summarize(rows, config) -> rows of a summary table (written to `summary_file`), or None.
  """
  name: str
  summary: str
  config: type
  quick: dict
  run: Callable
  plot: Callable
  default_seeds: int = 1
  summarize: Callable | None = None
  summary_file: str = "summary.csv"


RECIPES: dict[str, Recipe] = {}


def register(recipe: Recipe) -> Recipe:
  RECIPES[recipe.name] = recipe
  return recipe


def get(name: str) -> Recipe:
  if name not in RECIPES:
    raise cfg.ConfigError(f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)}")
  return RECIPES[name]


def resolve(name: str, *, quick: bool = False, overrides=()):
  """The validated configuration of recipe `name` (defaults, then --quick, then --set)."""
  recipe = get(name)
  config = recipe.config()
  if quick:
    config = dataclasses.replace(config, **recipe.quick)
  return cfg.override(config, list(overrides))


def check_seeds(seeds) -> int:
  if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
    raise cfg.ConfigError(f"--seeds must be an integer >= 1, got {seeds!r}")
  return seeds


def _call_unit(name, compute):
  del name
  return compute()


def _prepare(name, quick, seeds, overrides):
  """(recipe, validated config, number of seeds): every check, before any work."""
  recipe = get(name)
  config = resolve(name, quick=quick, overrides=overrides)
  return recipe, config, check_seeds(recipe.default_seeds if seeds is None else seeds)


def run(name: str, *, quick: bool = False, seeds: int | None = None, overrides=(),
        progress: bool = True) -> tuple[list[dict], object]:
  """Runs recipe `name` in memory; returns (rows, resolved config). Writes no files."""
  recipe, config, seeds = _prepare(name, quick, seeds, overrides)
  return recipe.run(config, seeds, unit=_call_unit, progress=progress), config


def run_to_dir(name: str, *, quick: bool = False, seeds: int | None = None, overrides=(),
               out: str | None = None, progress: bool = True) -> str:
  """Runs recipe `name` and writes metrics.csv, config.json, NAME.png (and the summary
  table, e.g. summary.csv or table1.csv, where the recipe has one) into `out`.

  Finished units are saved under out/parts, so running again with the same `out` and
  configuration resumes instead of starting over. Returns the output directory.
  """
  recipe, config, seeds = _prepare(name, quick, seeds, overrides)
  if out is None:
    out = os.path.join("runs", f"{name}-{datetime.datetime.now():%Y%m%d-%H%M%S}")
  run_dir = outputs.RunDir(out, {"recipe": name, "quick": quick, "seeds": seeds,
                                 "config": dataclasses.asdict(config),
                                 "versions": outputs.versions()})
  rows = recipe.run(config, seeds, unit=run_dir.unit, progress=progress)
  run_dir.write_csv("metrics.csv", rows)
  if recipe.summarize is not None:
    run_dir.write_csv(recipe.summary_file, recipe.summarize(rows, config),
                      first=("algorithm",))
  outputs.atomic_write(os.path.join(out, f"{name}.png"),
                       lambda f: recipe.plot(rows, config, f))
  return out
