"""Named experiments (one per paper figure): importing this registers them all."""

from fedjax_rep.recipes import (fedavg_ft_fig1, fedavg_ft_fig3, fedrep_fig1,  # noqa: F401
                                fedrep_fig3, fedrep_fig4)
from fedjax_rep.recipes.registry import RECIPES, get, resolve, run, run_to_dir  # noqa: F401
