"""Per-client state: pytrees whose leaves have a leading client axis."""

import jax
import jax.numpy as jnp


def gather(tree, clients: jax.Array):
  """Rows `clients` [c] of every leaf of a per-client pytree ([n, ...] -> [c, ...])."""
  return jax.tree.map(lambda leaf: leaf[clients], tree)


def scatter(tree, clients: jax.Array, rows):
  """Per-client pytree with rows `clients` replaced by `rows` ([c, ...]); other clients keep theirs."""
  return jax.tree.map(lambda leaf, new: leaf.at[clients].set(new), tree, rows)


def stack(trees):
  """One pytree whose leaves stack those of `trees` along a new leading axis (a sweep)."""
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)
