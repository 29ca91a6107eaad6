"""Opt-in C++ kernels (XLA FFI custom calls on the CPU), built only when asked for.

Nothing in the package runs them by default: `FedRep(kernel="native")` is the one way in
(`linear.fedrep` imports this package only then). The first `build.load` of a kernel on a
machine compiles its C++ source (`<library>.cc` beside this file) with the machine's
compiler; `build.build_key` names that build without compiling anything.

Modules: `build` (compiling, caching and registering a kernel library), `fedrep_round`
(FedRep's round with exact heads, `fedrep_round.cc`).
"""

from fedjax_rep.native.build import NativeUnavailable, build_key

__all__ = ["NativeUnavailable", "build_key"]
