"""The package's import graph, imports inside functions counted: no circle, and lazy imports
only where listed (LAZY)."""

import ast
import pathlib

import fedjax_rep

ROOT = pathlib.Path(fedjax_rep.__file__).parent

# The imports allowed inside functions: (importing module, imported module prefix, why).
# "*" imports from any module.
LAZY = (
    ("*", "matplotlib", "figures only: a slow import most calls never need"),
    ("*", "orbax", "checkpoints only: a slow import most runs never need"),
    ("*", "tensorflow_datasets", "real datasets only: a slow, optional import"),
    ("*", "sklearn", "the digits dataset only: an optional import"),
    ("*", "fedjax_rep.native", "the opt-in C++ kernel, built on first use"),
    ("fedjax_rep.experiments.tracking", "tensorboardX", "--log tensorboard only: optional"),
    ("fedjax_rep.experiments.tracking", "tensorboard", "--log tensorboard only: optional"),
    ("fedjax_rep.experiments.tracking", "mlflow", "--log mlflow only: optional"),
    ("fedjax_rep.cli", "", "the command line imports jax late: --help and list stay fast"),
    ("fedjax_rep.core.checkpoint", "fedjax_rep.core.distributed",
     "the command line imports it before jax"),
    ("fedjax_rep.experiments.outputs", "jax", "the command line imports it before jax"),
    ("fedjax_rep.experiments.sampling", "scipy", "--sample only: a slow import most runs "
     "never need"),
    ("fedjax_rep.privacy.accountant", "dp_accounting", "DP runs only: the optional privacy "
     "extra"),
)


def module_name(path: pathlib.Path) -> str:
  """The dotted name of the package's file `path` (a package's __init__: the package)."""
  parts = path.relative_to(ROOT.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imported(node, name: str) -> list[str]:
  """The modules an import statement `node` of module `name` names: the package's own as
  the deepest module of the package they name, others as written."""
  if isinstance(node, ast.Import):
    targets = [alias.name for alias in node.names]
  else:
    base = node.module or ""
    if node.level:
      package = name.split(".") if MODULES[name].name == "__init__.py" else name.split(".")[:-1]
      base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
               for alias in node.names]
  out = []
  for target in targets:
    while target.startswith("fedjax_rep") and target not in MODULES:
      target = target.rpartition(".")[0]
    out.append(target)
  return out


def imports(name: str) -> list[tuple[str, bool]]:
  """(imported module, inside a function) of every import of module `name`."""
  out = []

  def visit(node, inside):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.Import, ast.ImportFrom)):
        out.extend((target, inside) for target in imported(child, name))
      visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

  visit(ast.parse(MODULES[name].read_text()), False)
  return out


def graph() -> dict[str, set[str]]:
  """{module: the package's modules it imports, at the top or inside functions}."""
  return {name: {t for t, _ in imports(name) if t in MODULES and t != name} for name in MODULES}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def strong(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(edges[v]):
      if w not in index:
        strong(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while not component or component[-1] != v:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(edges):
    if v not in index:
      strong(v)
  return found


def allowed(importer: str, target: str) -> bool:
  """Whether LAZY lets module `importer` import `target` inside a function."""
  return any(who in ("*", importer) and (target == prefix or target.startswith(prefix + ".")
                                         or not prefix)
             for who, prefix, _ in LAZY)


def test_the_import_graph_has_no_circle():
  assert circles(graph()) == []


def test_imports_inside_functions_are_only_the_listed_ones():
  lazy = sorted({(name, target) for name in MODULES for target, inside in imports(name)
                 if inside and not allowed(name, target)})
  assert lazy == []


def test_the_graph_sees_lazy_imports_and_circles():
  assert ("fedjax_rep.native.fedrep_round", True) in imports("fedjax_rep.linear.fedrep")
  assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The package's layers, lowest first: a module imports the package's modules of its own
# layer or of lower ones, never of a higher one (no arrow back up). Modules in one layer's
# set are peers that do not import each other's packages.
LAYERS = (
    {"core"},                                # the contract, the round loop, keys, checkpoints
    {"native"},                              # the opt-in C++ kernels
    {"data", "hetero", "linear", "privacy"},  # datasets; clocks and speeds; the linear
                                              # theory; DP accounting
    {"nn"},                                  # the neural algorithms (on data's datasets)
    {"experiments"},                         # the framework that runs any recipe
    {"recipes"},                             # the papers
    {"supervisor", "api"},                   # the job supervisor; the public API
    {"cli"},                                 # the command line
    {"__init__", "__main__"},
)


def layer(module: str) -> int:
  """The index in LAYERS of the package's module `module` (its top package below
  fedjax_rep; `fedjax_rep` itself is __init__)."""
  top = module.split(".")[1] if "." in module else "__init__"
  return next(i for i, names in enumerate(LAYERS) if top in names)


def test_every_module_is_in_a_layer():
  assert {name.split(".")[1] for name in MODULES if "." in name} <= set().union(*LAYERS)


def test_no_import_goes_up_a_layer_or_across_peers():
  """Every arrow of the import graph goes down (or stays inside one package)."""
  up = sorted((name, target) for name, targets in graph().items() for target in targets
              if layer(target) > layer(name) or (
                  layer(target) == layer(name)
                  and target.split(".")[1:2] != name.split(".")[1:2]))
  assert up == []
