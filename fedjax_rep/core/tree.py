"""Per-client state: pytrees whose leaves have a leading client axis; nested dicts as flat
dicts with '/'-joined keys (as flax.traverse_util's, without importing flax)."""

from collections.abc import Mapping

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


def flatten(nested: Mapping) -> dict:
  """{'a/b/c': leaf} of nested dicts {'a': {'b': {'c': leaf}}}, depth first in key order;
  empty dicts are dropped."""
  flat = {}
  for key, value in nested.items():
    if isinstance(value, Mapping):
      flat.update({f"{key}/{path}": leaf for path, leaf in flatten(value).items()})
    else:
      flat[key] = value
  return flat


def unflatten(flat: Mapping) -> dict:
  """The nested dicts of a flat dict with '/'-joined keys (inverse of `flatten`)."""
  nested = {}
  for path, leaf in flat.items():
    *parents, name = path.split("/")
    node = nested
    for parent in parents:
      node = node.setdefault(parent, {})
    node[name] = leaf
  return nested
