"""Per-client state: pytrees whose leaves have a leading client axis; nested dicts as flat
dicts with '/'-joined keys (as flax.traverse_util's, without importing flax)."""

from collections.abc import Mapping
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def gather(tree, clients: jax.Array):
  """Rows `clients` of every leaf of a per-client pytree.

  Args:
    tree: a pytree whose leaves are [n, ...].
    clients: client indices [c].

  Returns:
    The pytree with leaves [c, ...].
  """
  return jax.tree.map(lambda leaf: leaf[clients], tree)


def scatter(tree, clients: jax.Array, rows):
  """Per-client pytree with rows `clients` replaced by `rows`; other clients keep theirs.

  Args:
    tree: a pytree whose leaves are [n, ...].
    clients: client indices [c].
    rows: a pytree of the same structure with leaves [c, ...].

  Returns:
    The pytree with leaves [n, ...].
  """
  return jax.tree.map(lambda leaf, new: leaf.at[clients].set(new), tree, rows)


def client_map(fn: Callable, per_client, group: int | None):
  """fn applied to every client of `per_client` (a pytree with leading axis c): `vmap` over
  groups of `group` clients, the groups one after another (`lax.map` with batch_size), so
  XLA's temporaries are those of one group. group=None: one vmap over all c. Arguments
  shared by all clients are closed over by `fn` (unbatched: e.g. the frozen body)."""
  if group is None:
    return jax.vmap(fn)(per_client)
  if group == 1:  # a plain scan: XLA:CPU runs vmaps of size 1 as slower batched dots
    return jax.lax.map(fn, per_client)
  return jax.lax.map(fn, per_client, batch_size=group)


def stack(trees):
  """One pytree whose leaves stack those of `trees` along a new leading axis (a sweep).

  Args:
    trees: s pytrees of one structure whose corresponding leaves have one shape [...].

  Returns:
    The pytree with leaves [s, ...].
  """
  return jax.tree.map(_stack, *trees)


def _stack(*leaves):
  """Leaves stacked on the host and placed on the device (no device program compiles);
  PRNG key arrays, which have no host form, on the device."""
  if isinstance(leaves[0], jax.Array) and jnp.issubdtype(leaves[0].dtype, jax.dtypes.prng_key):
    return jnp.stack(leaves)
  return jax.device_put(np.stack(leaves))


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
