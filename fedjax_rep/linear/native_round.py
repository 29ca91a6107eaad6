"""The FedRep round on fixed data as one C++ kernel (`fedrep_fixed_round.cc`, an XLA FFI
custom call): every client's exact head and the summed gradient in B, each client's data read
from memory once.

XLA:CPU runs the same round as a scan over cache-sized blocks of several fusions and dots
(`FedRep._clients`); at n = 100,000 (d = 50, k = 5, m = 10) that reaches 12-20% of the
memory roofline, the kernel 40-70% (median 51%), 2.2-3.6x faster (benchmarks/README.md).
It computes the same numbers up to float32 round-off (other summation orders) and is
deterministic: its sums are added in a fixed order whatever the number of threads.
"""

import jax
import jax.numpy as jnp

from fedjax_rep.core import native

NAME = "fedrep_fixed_round"
MAX_REP_DIM = 8  # the k features of a sample fill one 256-bit register
AUTO_MIN_ELEMENTS = 1 << 20  # kernel="auto" runs it from this many entries of X (4 MiB) on,
                             # where its first build (a few seconds, once per machine) pays
KERNELS = ("auto", "xla", "native")


def unsupported(X, rep_dim: int) -> str | None:
  """Why the kernel cannot run a round on data X [n, m, d] with rep_dim k, or None."""
  if jax.default_backend() != "cpu":
    return f"it runs on the CPU only (the default backend is {jax.default_backend()})"
  if X.dtype != jnp.float32:
    return f"it computes in float32 (X is {X.dtype})"
  if rep_dim > MAX_REP_DIM:
    return f"it needs rep_dim <= {MAX_REP_DIM} (got {rep_dim})"
  if X.shape[1] < rep_dim:
    return (f"it solves the normal equations, which need samples per client >= rep_dim "
            f"(got {X.shape[1]} < {rep_dim})")
  return None


def fixed_round(X: jax.Array, y: jax.Array, counts: jax.Array, B: jax.Array):
  """(heads w [n, k], gradient [k, d], loss []) of one FedRep round on fixed data:
  w_i the exact least-squares head on Z_i = X_i B (ridge 1e-6 trace / k, as
  `heads.least_squares`), gradient = sum_i w_i r_i^T X_i / counts_i (the transposed sum of
  the clients' gradients in B), loss = sum_i ||r_i||^2 / (2 counts_i), r_i = Z_i w_i - y_i.

  X [n, m, d], y [n, m] (padding rows zero), counts [n] real samples per client, B [d, k];
  all float32. The kernel must be loaded (`native.load(NAME)`). Under vmap it runs once per
  batch element.
  """
  n, _, d = X.shape
  k = B.shape[1]
  out = (jax.ShapeDtypeStruct((n, k), jnp.float32), jax.ShapeDtypeStruct((k, d), jnp.float32),
         jax.ShapeDtypeStruct((), jnp.float32))
  return jax.ffi.ffi_call(NAME, out, vmap_method="sequential")(
      X, y, counts.astype(jnp.float32), B.astype(jnp.float32))
