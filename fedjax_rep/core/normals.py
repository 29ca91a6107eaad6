"""Standard normals exactly as `jax.random.normal` draws them, with Threefry unrolled.

On CPU JAX lowers the Threefry-2x32 hash as a loop of 5 steps whose state goes through
memory between steps; written out in jnp (the same 20 rounds: `core.threefry.hash_2x32`,
rolled=False; the same counters, uniform and erf_inv), XLA fuses hash and transform into
one loop over the output, several times faster. The draws are bit-for-bit those of
`jax.random.normal(key, shape)` for the default key implementation (threefry2x32,
`jax_threefry_partitionable`); any other key falls back to `jax.random.normal`.
`normal_pairs` (for samplers that need only the distribution) uses both output words of
each hash, two normals per hash.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fedjax_rep.core import threefry


def unrolled_applies(key: jax.Array, shape) -> bool:
  """Whether `normal` draws with `key` (one typed key) and `shape` by the unrolled hash: the
  default threefry2x32 implementation, partitionable, fewer than 2^32 entries."""
  return (str(jax.random.key_impl(key)) == "threefry2x32"
          and jax.config.jax_threefry_partitionable and math.prod(shape) < 2 ** 32)


def _normal_from_bits(bits: jax.Array) -> jax.Array:
  """sqrt(2) erf_inv(u) (float32, shape of bits) of u uniform on [nextafter(-1, 0), 1) made
  from the top 23 bits of the uint32 `bits`, exactly as jax.random.normal does."""
  one = np.array(1.0, np.float32)
  floats = lax.bitcast_convert_type(
      lax.shift_right_logical(bits, np.uint32(32 - 23)) | one.view(np.uint32), jnp.float32) - one
  low = np.nextafter(np.float32(-1.0), np.float32(0.0))
  uniform = lax.max(low, floats * (one - low) + low)
  return np.float32(np.sqrt(2)) * lax.erf_inv(uniform)


def normal(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
  """jax.random.normal(key, shape, dtype) [shape] (float32), drawn with the unrolled hash.

  key: one typed PRNG key (use `vmap` for many). The bits of entry j (row-major) are
  threefry2x32(key, (0, j)), XOR-ed, as in JAX; then uniform on [nextafter(-1, 0), 1) and
  sqrt(2) erf_inv, as in JAX.
  """
  if jnp.dtype(dtype) != jnp.float32 or not unrolled_applies(key, shape):
    return jax.random.normal(key, shape, dtype)
  k1, k2 = jax.random.key_data(key)
  counts = lax.iota(np.uint32, math.prod(shape)).reshape(shape)
  bits1, bits2 = threefry.hash_2x32(k1, k2, jnp.zeros_like(counts), counts, rolled=False)
  return _normal_from_bits(bits1 ^ bits2)


def normal_pairs(key: jax.Array, size: int) -> jax.Array:
  """size i.i.d. standard normals [size] (float32), two per Threefry hash: half the hashes of
  `normal`, the same distribution, other values than jax.random.normal.

  key: one typed PRNG key (use `vmap` for many). Entries j and h + j (h = ceil(size / 2))
  are the transforms (as in `normal`) of the two output words of threefry2x32(key, (0, j)),
  which are independent uniform 32-bit words, so the entries are independent standard
  normals. A key other than threefry2x32 falls back to jax.random.normal.
  """
  if not unrolled_applies(key, (size,)):
    return jax.random.normal(key, (size,))
  k1, k2 = jax.random.key_data(key)
  counts = lax.iota(np.uint32, -(-size // 2))
  bits1, bits2 = threefry.hash_2x32(k1, k2, jnp.zeros_like(counts), counts, rolled=False)
  return _normal_from_bits(jnp.concatenate([bits1, bits2])[:size])
