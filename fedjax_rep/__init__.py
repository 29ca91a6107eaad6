"""fedjax_rep: a vectorised JAX simulator of federated representation learning.

The flat public API (`fedjax_rep.api`) loads on the first name asked of the package
(`fr.FedRep`, `from fedjax_rep import FedRep`, `fr.linear.problem`), not on `import
fedjax_rep`, nor on a module's import (`from fedjax_rep import cli`): the command line
imports only the modules its recipe uses. Implementation lives in the subpackages.
"""

import importlib
import importlib.util

__version__ = "0.1.0"


def _api() -> dict:
  """The public names of `fedjax_rep.api` (importing it the first time)."""
  api = importlib.import_module(f"{__name__}.api")
  return {key: value for key, value in vars(api).items() if not key.startswith("_")}


def __getattr__(name: str):
  spec = importlib.util.find_spec(f"{__name__}.{name}") if name.isidentifier() else None
  if spec is not None and spec.submodule_search_locations is None:  # a module, not a package
    return importlib.import_module(f"{__name__}.{name}")
  globals().update(_api())
  if name not in globals():
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return globals()[name]


def __dir__() -> list[str]:
  return sorted({*globals(), *_api()})
