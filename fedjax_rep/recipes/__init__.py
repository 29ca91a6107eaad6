"""Named experiments (one per paper figure): importing this registers them all."""

# Registration order is listing order: FedRep, then FedAvg-FT, FLUTE, SRPFL, neural.
from fedjax_rep.recipes import fedrep_fig1, fedrep_fig3, fedrep_fig4  # noqa: F401  isort: skip
from fedjax_rep.recipes import fedavg_ft_fig1, fedavg_ft_fig3, fedavg_ft_neural  # noqa: F401  isort: skip
from fedjax_rep.recipes import flute_fig1, flute_fig3, flute_fig4  # noqa: F401  isort: skip
from fedjax_rep.recipes import srpfl_linear, srpfl_speedup  # noqa: F401  isort: skip
from fedjax_rep.recipes import digits_personalized  # noqa: F401  isort: skip
from fedjax_rep.recipes import table1_synthetic, fedrep_table1  # noqa: F401  isort: skip
from fedjax_rep.recipes import flute_table1  # noqa: F401  isort: skip
from fedjax_rep.recipes import srpfl_neural  # noqa: F401  isort: skip
from fedjax_rep.recipes.registry import RECIPES, get, resolve, run, run_to_dir  # noqa: F401
