"""Named experiments (one per paper figure): importing this registers them all."""

from fedjax_rep.recipes import fedrep_fig1, fedrep_fig3, fedrep_fig4  # noqa: F401
from fedjax_rep.recipes.registry import RECIPES, get, resolve, run, run_to_dir  # noqa: F401
