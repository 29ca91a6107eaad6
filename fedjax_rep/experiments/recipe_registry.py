"""Named experiments: the `Recipe` record, and the registry that finds them.

A recipe is one module that calls `register(Recipe(...))`. `all_recipes` imports every
module of the `fedjax_rep.recipes` subpackages (fedrep/, flute/, ...) and of the packages
that installed distributions name under the entry-point group `fedjax_rep.recipes`, so a
new figure is one new file. `resolve` gives a recipe's validated configuration; running
it is `runner`'s.
"""

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import itertools
import pkgutil
from collections.abc import Callable

from fedjax_rep.experiments import config as cfg

ENTRY_POINTS = "fedjax_rep.recipes"  # entry-point group: packages (or modules) of recipes
PAPERS = "fedjax_rep.recipes"  # the package of the papers' recipes, one subpackage a paper


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A named experiment.

  run(config, seeds, unit, progress) -> rows (list of dicts, one per algorithm x seed x round);
  `unit(name, compute)` caches a unit of work (see outputs.RunDir.unit).
  traced: configuration keys (scalar numbers, or traced options) that run sweeps inside one
  program, or a function of the configuration returning them (e.g. the options its
  algorithms declare: `neural.traced_keys`). When a grid sweeps some of them, run is called
  as run(config, seeds, unit, progress, grid=[{KEY: value}, ...]): one dict per combination
  of the swept traced keys, `config` holding their unswept values; it returns the rows of
  every combination, each row carrying those keys as columns with the values of its dict.
  defaults: the recipe's values of fields of `config` (e.g. the dataset and its settings,
  where recipes share a configuration class), applied before `quick` and --set.
  plot(rows, config, path) draws the paper-style figure into `path` (PNG).
  summarize(rows, config) -> rows of a summary table (written to `summary_file`), or None.
  summary_only: columns of the rows that only the summary reports (e.g. a method's cost per
  round, `neural.COST`): metrics.csv leaves them out.
  mock_data(config) -> what mock data a configuration trains on instead of the recipe's
  dataset (e.g. "random examples in the format of CIFAR-10"), None where it trains on the real
  data; said on stderr before the run (`runner.mock_lines`).
  rank: its place in `fedjax-rep list` and the README's table (ascending, then by name).
  docs: the page that explains it, relative to the repository root (README's table links it).
  searchable: run trains each grid of traced keys per algorithm and setting as the
  candidates of one `batch.Batch.train` call (`neural.trained`), which --search can stop
  early (`search`).
  privacy: run applies user-level DP where the configuration asks for it (dp_epsilon,
  dp_noise, dp_clip: `neural.trained`); elsewhere asking is refused.
  """
  name: str
  summary: str
  config: type
  quick: dict
  run: Callable
  plot: Callable
  defaults: dict = dataclasses.field(default_factory=dict)
  default_seeds: int = 1
  summarize: Callable | None = None
  summary_file: str = "summary.csv"
  summary_only: tuple[str, ...] = ()
  traced: tuple[str, ...] | Callable = ()
  mock_data: Callable | None = None
  rank: int = 1000
  docs: str = ""
  searchable: bool = False
  privacy: bool = False


RECIPES: dict[str, Recipe] = {}  # the recipes registered so far (see `all_recipes`)


def register(recipe: Recipe) -> Recipe:
  """Adds `recipe` to RECIPES; its config must derive from `config.Config`, its traced keys
  be scalar number fields of its config."""
  if not issubclass(recipe.config, cfg.Config):
    raise ValueError(f"recipe {recipe.name}: its configuration {recipe.config.__name__} does "
                     f"not derive from fedjax_rep.experiments.config.Config; derive it from "
                     f"that class (or one of its subclasses)")
  known = cfg.fields(recipe.config)
  for key in () if callable(recipe.traced) else recipe.traced:
    check = known[key].metadata["check"] if key in known else None
    if check is None or check.sequence or check.kind not in (int, float):
      raise ValueError(f"recipe {recipe.name}: traced key {key!r} is not a number field of "
                       f"its configuration; trace only scalar numbers")
  RECIPES[recipe.name] = recipe
  return recipe


def _import(name: str):
  """Module `name`, imported; ConfigError (one line) where importing it raises."""
  try:
    return importlib.import_module(name)
  except Exception as error:  # noqa: BLE001  a recipe module that fails is one line
    message = " ".join(str(error).split())
    raise cfg.ConfigError(f"recipe module {name} raised {type(error).__name__} while "
                          f"importing: {message}; fix it, or uninstall the package that "
                          f"names it under the entry points {ENTRY_POINTS!r}") from error


def _import_tree(name: str) -> None:
  """Imports module `name` and, where it is a package, every module below it."""
  module = _import(name)
  for info in pkgutil.walk_packages(getattr(module, "__path__", ()), prefix=f"{name}."):
    _import(info.name)


def recipe_packages() -> list[str]:
  """The packages whose modules define recipes: the subpackages of `fedjax_rep.recipes`,
  then those that installed distributions name under the entry-point group ENTRY_POINTS."""
  here = pkgutil.iter_modules(importlib.import_module(PAPERS).__path__)
  return ([f"{PAPERS}.{info.name}" for info in sorted(here, key=lambda i: i.name)
           if info.ispkg]
          + [point.value for point in importlib.metadata.entry_points(group=ENTRY_POINTS)])


def all_recipes() -> dict[str, Recipe]:
  """Every recipe, in listing order (`Recipe.rank`, then name), after importing every module
  of `recipe_packages`."""
  for package in recipe_packages():
    _import_tree(package)
  return dict(sorted(RECIPES.items(), key=lambda item: (item[1].rank, item[0])))


def _spelled_modules(name: str) -> list[str]:
  """The modules below `fedjax_rep.recipes` that a prefix of `name` spells, hyphens read as
  dots or underscores, longest first: fedrep-fig3 -> fedrep.fig3, fedavg-ft-fig1 ->
  fedavg_ft.fig1, fedrep-table1-cifar10 -> fedrep.table1."""
  parts = str(name).split("-")
  spelled = []
  for end in range(len(parts), 0, -1):
    for joins in itertools.product("._", repeat=end - 1):
      path = parts[0] + "".join(j + p for j, p in zip(joins, parts[1:end]))
      try:
        found = importlib.util.find_spec(f"{PAPERS}.{path}")
      except (ImportError, ValueError):
        found = None
      if found is not None:
        spelled.append(found.name)
  return spelled


def get(name: str) -> Recipe:
  """The recipe `name`: first from the module its name spells (`_spelled_modules`, so a
  linear recipe imports no neural code), else from every module (`all_recipes`);
  ConfigError naming the known recipes if there is none."""
  for module in _spelled_modules(name) if name not in RECIPES else ():
    _import(module)
    if name in RECIPES:
      break
  if name not in RECIPES:
    known = all_recipes()
    if name not in known:
      raise cfg.ConfigError(f"unknown recipe {name!r}; known recipes: {', '.join(known)}")
  return RECIPES[name]


def default_config(recipe: Recipe):
  """The configuration of `recipe` at its defaults: its config's, with its `defaults` over
  them (not validated)."""
  return recipe.config(**recipe.defaults)


def resolve(name: str, *, quick: bool = False, overrides=()):
  """The validated configuration of recipe `name`.

  Its defaults, then the recipe's --quick settings (`quick`), then `overrides`.

  Args:
    name: a recipe's name (`fedjax-rep list`).
    quick: apply the recipe's --quick settings.
    overrides: 'KEY=VALUE' items, as `--set` takes them.

  Returns:
    The recipe's configuration dataclass; ConfigError (naming the key and its range) for a
    bad key or value.
  """
  recipe = get(name)
  config = default_config(recipe)
  if quick:
    config = dataclasses.replace(config, **recipe.quick)
  return cfg.override(config, list(overrides))
