"""The client axis in blocks: a scan over contiguous blocks of clients adding up their sums.

A round that runs every client at once materialises [n, m, d] temporaries and reads the
clients' data several times from memory; in blocks of `block` clients whose data fit in the
CPU's cache, each client's data is read (or generated) once and only the per-block sums
(d x k gradients, k x k statistics, losses) and the per-client outputs (heads [n, k])
leave the block. On an accelerator (a GPU) there is no such cache to fit: its blocks are
large (DEVICE_BLOCK_BYTES of data), so that a round is few scan steps of large kernels
while its memory stays bounded by the block.
"""

import functools
import os

import jax
import jax.numpy as jnp

FALLBACK_CACHE_BYTES = 1 << 20  # when the cache size cannot be read
CACHE_MULTIPLE = 2  # a block's generated data: this many per-core caches
# A block of data read from memory (fixed datasets): this many per-core caches, the fastest
# multiple for the fixed FedRep round of those measured (see docs/benchmarks.md).
READ_CACHE_MULTIPLE = 4
DEVICE_BLOCK_BYTES = 1 << 30  # a block's data on an accelerator (the default backend not cpu)
CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"


def _parse_size(text: str) -> int:
  """Bytes of a sysfs cache size such as '1024K' or '32M'."""
  text = text.strip().upper()
  scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
  return int(text.rstrip("KMG")) * scale


@functools.cache
def cache_bytes() -> int:
  """Bytes of CPU 0's largest per-core cache (data or unified, level <= 2), read from
  sysfs; FALLBACK_CACHE_BYTES (1 MiB) where it cannot be read."""
  sizes = []
  try:
    for entry in os.listdir(CACHE_DIR):
      path = os.path.join(CACHE_DIR, entry)
      if not entry.startswith("index"):
        continue
      with open(os.path.join(path, "level")) as f:
        level = int(f.read())
      with open(os.path.join(path, "type")) as f:
        kind = f.read().strip()
      with open(os.path.join(path, "size")) as f:
        size = _parse_size(f.read())
      if level <= 2 and kind in ("Data", "Unified"):
        sizes.append(size)
  except (OSError, ValueError):
    sizes = []
  return max(sizes) if sizes else FALLBACK_CACHE_BYTES


def block_size(num_clients: int, bytes_per_client: int, block: int | None = None,
               read: bool = False) -> int:
  """Clients per block (static): `block` if given, else as many as keep a block's data
  within CACHE_MULTIPLE (READ_CACHE_MULTIPLE for data `read` from memory rather than
  generated) x `cache_bytes()` where jax's default backend is the CPU, within
  DEVICE_BLOCK_BYTES on an accelerator; at most num_clients, at least 1."""
  if block is not None:
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
      raise ValueError(f"block (clients per block) must be an integer >= 1 or None "
                       f"(automatic), got {block!r}")
    return min(block, max(num_clients, 1))
  if jax.default_backend() == "cpu":
    budget = (READ_CACHE_MULTIPLE if read else CACHE_MULTIPLE) * cache_bytes()
  else:
    budget = DEVICE_BLOCK_BYTES
  return max(1, min(num_clients, budget // max(bytes_per_client, 1)))


def _zeros(shape):
  """Zeros of `shape` (a ShapeDtypeStruct), varying over the same shard_map axes (so that a
  scan carry starting from them has the type of the sums added to it)."""
  zeros = jnp.zeros(shape.shape, shape.dtype)
  varying = tuple(getattr(getattr(shape, "manual_axis_type", None), "varying", ()))
  return jax.lax.pcast(zeros, varying, to="varying") if varying else zeros


def map_blocks(fn, num: int, block: int, per_client=()):
  """(sum over blocks of fn's sums, fn's outputs concatenated [num, ...]).

  fn(start, size, parts) -> (sums, outputs) runs one block: positions start..start+size-1
  (start a traced int32, size a static int), parts the slices [size, ...] of the arrays
  `per_client` (a tuple of arrays [num, ...]); sums is a pytree of arrays added over the
  blocks, outputs a pytree of arrays [size, ...].
  Full blocks run under one `lax.scan` that slices `per_client` in place (dynamic_slice:
  no copy); a last block of num % block positions runs after it (fn is traced twice then).
  One block (block >= num) is a plain call.
  """
  full, rest = divmod(num, block)

  def run(start, size):
    parts = tuple(jax.lax.dynamic_slice_in_dim(a, start, size) for a in per_client)
    return fn(start, size, parts)

  if full <= 1 and not (full and rest):
    return run(jnp.int32(0), num)
  pieces, sums = [], None
  if full:
    def body(total, b):
      block_sums, outputs = run(b * block, block)
      return jax.tree.map(jnp.add, total, block_sums), outputs

    zeros = jax.tree.map(_zeros, jax.eval_shape(lambda: run(jnp.int32(0), block)[0]))
    sums, outputs = jax.lax.scan(body, zeros, jnp.arange(full, dtype=jnp.int32))
    pieces.append(jax.tree.map(lambda o: o.reshape(full * block, *o.shape[2:]), outputs))
  if rest:
    rest_sums, rest_outputs = run(jnp.int32(full * block), rest)
    sums = rest_sums if sums is None else jax.tree.map(jnp.add, sums, rest_sums)
    pieces.append(rest_outputs)
  if len(pieces) == 1:
    return sums, pieces[0]
  return sums, jax.tree.map(lambda *o: jnp.concatenate(o), *pieces)

