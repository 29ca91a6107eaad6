"""The FedRep round with exact heads as one C++ kernel (`fedrep_round.cc`, XLA FFI custom
calls), run by `FedRep(kernel="native")`: on fixed data (`fixed_round`), every client's head
and the summed gradient in B with each client's data read from memory once; on fresh data
drawn by the statistics sampler (`fresh_round`), the same with each client's samples
generated in cache and never stored.

XLA:CPU runs the same rounds as a scan over cache-sized blocks of several fusions and dots
(`FedRep._clients`); benchmarks/linear_round.py times the two (docs/benchmarks.md has the
numbers). The kernels compute the same numbers up to float32 round-off (other summation
orders; the fresh round's normals are XLA's sqrt(2) erf_inv up to round-off, bounded in
docs/benchmarks.md) and are deterministic: their sums are added in a fixed order whatever
the number of threads.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import normals
from fedjax_rep.native import build

LIBRARY = "fedrep_round"
FIXED = "fedrep_fixed_round"
FRESH = "fedrep_fresh_round"
MAX_REP_DIM = 8  # the k features of a sample fill one 256-bit register


def unsupported(dtype, samples: int, rep_dim: int) -> str | None:
  """Why the kernels cannot run a round on data of `dtype` with `samples` per client and
  rep_dim k, or None."""
  if jax.default_backend() != "cpu":
    return f"it runs on the CPU only (the default backend is {jax.default_backend()})"
  if dtype != jnp.float32:
    return f"it computes in float32 (the data are {dtype})"
  if rep_dim > MAX_REP_DIM:
    return f"it needs rep_dim <= {MAX_REP_DIM} (got {rep_dim})"
  if samples < rep_dim:
    return (f"it solves the normal equations, which need samples per client >= rep_dim "
            f"(got {samples} < {rep_dim})")
  return None


def unsupported_key(key: jax.Array) -> str | None:
  """Why `fresh_round` cannot draw with `key` as `fresh_statistics.sample` does, or None: it
  reproduces `normals.normal_pairs`' unrolled Threefry draws."""
  if not normals.unrolled_applies(key, (1,)):
    return (f"it draws threefry2x32 normals with jax_threefry_partitionable (got key "
            f"implementation {jax.random.key_impl(key)}, partitionable "
            f"{jax.config.jax_threefry_partitionable})")
  return None


def load(name: str) -> None:
  """Builds (once per machine) and registers (once per process) kernel `name` (FIXED or
  FRESH); `build.load`: NativeUnavailable where it cannot."""
  build.load(name, LIBRARY)


def build_key() -> str:
  """The file name of this machine's build of the kernels (`build.build_key`), without
  building them."""
  return build.build_key(LIBRARY)


def fixed_round(X: jax.Array, y: jax.Array, counts: jax.Array, B: jax.Array):
  """(heads w [n, k], gradient [k, d], loss []) of one FedRep round on fixed data:
  w_i the exact least-squares head on Z_i = X_i B (ridge 1e-6 trace / k, as
  `heads.least_squares`), gradient = sum_i w_i r_i^T X_i / counts_i (the transposed sum of
  the clients' gradients in B), loss = sum_i ||r_i||^2 / (2 counts_i), r_i = Z_i w_i - y_i.

  X [n, m, d], y [n, m] (padding rows zero), counts [n] real samples per client, B [d, k];
  all float32. The kernel must be loaded (`load(FIXED)`). Under vmap it runs once per
  batch element.
  """
  n, _, d = X.shape
  k = B.shape[1]
  out = (jax.ShapeDtypeStruct((n, k), jnp.float32), jax.ShapeDtypeStruct((k, d), jnp.float32),
         jax.ShapeDtypeStruct((), jnp.float32))
  return jax.ffi.ffi_call(FIXED, out, vmap_method="sequential")(
      X, y, counts.astype(jnp.float32), B.astype(jnp.float32))


def fresh_round(key: jax.Array, offset, heads_star: jax.Array, coords_star: jax.Array,
                coords: jax.Array, noise_std, samples: int):
  """(heads w [n, k], gradient [k, p], loss [], outside [k, k]) of one FedRep round on the
  fresh data that `fresh_statistics.sample(key, coords_star, heads_star, noise_std, samples,
  offset + arange(n))` draws (A_i [m, p], y_i; m = samples): `fixed_round`'s outputs on
  X = A, B = coords, counts = m, and outside = `fresh_statistics.residual_statistic` (all
  weights 1).

  key: a threefry2x32 key (`unsupported_key`); offset: the first client's id (uint32, may be
  traced); heads_star [n, k] the clients' W*; coords_star, coords [p, k] = Q^T B*, Q^T B;
  noise_std []. The samples are generated in the kernel, never stored. The kernel must be
  loaded (`load(FRESH)`). Under vmap it runs once per batch element.
  """
  n, k = heads_star.shape
  p = coords.shape[0]
  out = (jax.ShapeDtypeStruct((n, k), jnp.float32), jax.ShapeDtypeStruct((k, p), jnp.float32),
         jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((k, k), jnp.float32))
  return jax.ffi.ffi_call(FRESH, out, vmap_method="sequential")(
      jax.random.key_data(key), jnp.asarray(offset, jnp.uint32), heads_star.astype(jnp.float32),
      coords_star.astype(jnp.float32), coords.astype(jnp.float32),
      jnp.asarray(noise_std, jnp.float32), samples=np.int64(samples))
