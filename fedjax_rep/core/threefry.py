"""Opt-in: JAX's Threefry-2x32 hash lowered on one flat axis on the CPU (same bits).

Every `jax.random` draw, split and fold-in applies the Threefry-2x32 hash
(`jax.extend.random.threefry2x32_p`) elementwise to uint32 counters shaped like the result
(a vmapped weight draw hashes a [clients, 32, 10] array); on small multi-dimensional shapes
XLA:CPU's LLVM unrolls each such hash's loop fully. `use_flat(True)` registers a CPU
lowering of the primitive that broadcasts its four operands to their common shape, flattens
them to one axis, hashes them (`hash_2x32`) and reshapes the two results back: the same
bits, another compiled program. An explicit opt-in (`fedjax-rep run --flat-threefry`,
`fr.use_flat_threefry()`; config.json: code.threefry, code.threefry_scope) for the whole
process: every program lowered after the call, compiled ones staying as they were. It is
not scoped to some programs because JAX registers lowerings per process and its caches do
not key on a flag of ours. Other platforms keep JAX's lowering. Measurements:
docs/benchmarks.md.
"""

import numpy as np

import jax.numpy as jnp
from jax import lax
from jax.extend.random import threefry2x32_p
from jax.interpreters import mlir

# The hash's rotation constants: rounds 1-4 of every 8 use the first row, 5-8 the second
# (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011, Table 4).
ROTATIONS = (np.array([13, 15, 26, 6], np.uint32), np.array([17, 29, 16, 24], np.uint32))
PARITY = np.uint32(0x1BD11BDA)  # the key schedule's constant

_flat = False
_registered = False


def _rounds(x, rotations):
  """Four rounds of the hash on the words x = (x1, x2) with the rotations [4]."""
  for r in rotations:
    y0 = x[0] + x[1]
    x = (y0, y0 ^ (lax.shift_left(x[1], r) | lax.shift_right_logical(x[1], 32 - r)))
  return x


def hash_2x32(k1, k2, x1, x2, *, rolled: bool = True):
  """Threefry-2x32 with 20 rounds: (y1, y2), uint32 arrays of the operands' broadcast shape,
  of the counters (x1, x2) under the key (k1, k2) (uint32 arrays, broadcastable).

  rolled: the rounds as a loop of 5 steps of 4 rounds, as JAX's CPU lowering does (the
  operands first broadcast to one shape); else written out, 20 rounds that XLA fuses with
  what follows into one loop over the output (`core.normals`). The same bits either way.
  """
  if rolled:
    shape = jnp.broadcast_shapes(k1.shape, k2.shape, x1.shape, x2.shape)
    k1, k2, x1, x2 = (jnp.broadcast_to(a, shape) for a in (k1, k2, x1, x2))
  keys = (k1, k2, k1 ^ k2 ^ PARITY)
  x = (x1 + keys[0], x2 + keys[1])
  if not rolled:
    for i in range(5):
      x = _rounds(x, ROTATIONS[i % 2])
      x = (x[0] + keys[(i + 1) % 3], x[1] + keys[(i + 2) % 3] + np.uint32(i + 1))
    return x

  def step(i, state):
    x, keys, rotations = state
    x = _rounds(x, rotations[0])
    x = (x[0] + keys[1], x[1] + keys[2] + (i + 1).astype(np.uint32))
    return x, (*keys[1:], keys[0]), (rotations[1], rotations[0])

  x, _, _ = lax.fori_loop(0, 5, step, (x, keys, tuple(map(jnp.asarray, ROTATIONS))))
  return x


def _flat_hash(k1, k2, x1, x2):
  """`hash_2x32` of the operands broadcast and flattened to one axis, reshaped back."""
  shape = jnp.broadcast_shapes(k1.shape, k2.shape, x1.shape, x2.shape)
  flat = [jnp.broadcast_to(a, shape).reshape(-1) for a in (k1, k2, x1, x2)]
  return tuple(y.reshape(shape) for y in hash_2x32(*flat))


def _lowering(ctx, *operands):
  hash_fn = _flat_hash if _flat else hash_2x32
  return mlir.lower_fun(hash_fn, multiple_results=True)(ctx, *operands)


def use_flat(on: bool = True) -> None:
  """Sets how the whole process lowers JAX's Threefry hash on the CPU from now on.

  With `on`, `threefry2x32_p` is lowered as `_flat_hash` (its operands flattened to one
  axis); without, as `hash_2x32` on the operands' own shape, the structure of JAX's own CPU
  lowering. Process-wide: it applies to every program this process lowers for the CPU
  afterwards, of any run, not to the caller's alone, and not to programs already compiled
  (in memory or in the persistent cache). The first call with `on` registers the lowering
  with JAX for the rest of the process. The bits drawn are the same either way.

  Args:
    on: whether to lower the hash on one flat axis.

  Returns:
    None.
  """
  global _flat, _registered
  _flat = bool(on)
  if _flat and not _registered:
    mlir.register_lowering(threefry2x32_p, _lowering, platform="cpu")
    _registered = True


def flat() -> bool:
  """Whether programs this process lowers now hash on a flat axis on the CPU (`use_flat`)."""
  return _flat
