"""Per-client state: pytrees whose leaves have a leading client axis."""

import jax


def gather(tree, clients: jax.Array):
  """Rows `clients` [c] of every leaf of a per-client pytree ([n, ...] -> [c, ...])."""
  return jax.tree.map(lambda leaf: leaf[clients], tree)


def scatter(tree, clients: jax.Array, rows):
  """Per-client pytree with rows `clients` replaced by `rows` ([c, ...]); other clients keep theirs."""
  return jax.tree.map(lambda leaf, new: leaf.at[clients].set(new), tree, rows)
