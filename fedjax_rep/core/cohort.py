"""Fixed-size client cohorts, sampled uniformly without replacement."""

import jax
import jax.numpy as jnp
import numpy as np


def cohort_size(num_clients: int, participation: float) -> int:
  """Number of clients sampled per round: max(1, round(participation * num_clients)).

  Args:
    num_clients: clients in the population.
    participation: the fraction of them sampled each round.

  Returns:
    The cohort size, an int >= 1.
  """
  return max(1, round(participation * num_clients))


def sample_cohort(key: jax.Array, num_clients: int, size: int) -> jax.Array:
  """A cohort drawn uniformly without replacement from range(num_clients).

  The size is static, so every round has the same shape and nothing recompiles.
  With size == num_clients (full participation) the cohort is all clients in order.

  Args:
    key: the PRNG key of the draw.
    num_clients: clients in the population (static).
    size: the cohort size (static, <= num_clients).

  Returns:
    Client indices [size] (integers).
  """
  if size == num_clients:
    return jnp.arange(num_clients)
  return jax.random.choice(key, num_clients, (size,), replace=False)


def shuffle_rounds(num_clients: int) -> int:
  """Sorting rounds of jax.random.permutation over num_clients items (1 up to 1625)."""
  return int(np.ceil(3 * np.log(max(1, num_clients)) / np.log(np.iinfo(np.uint32).max)))


PACKED_SORT_MAX = 1 << 12  # stable_argsort packs indices into the keys up to this length


def stable_argsort(bits: jax.Array) -> jax.Array:
  """Indices [n] that sort uint32 `bits` [n] stably (ties: the lower index first), as
  lax.sort_key_val(bits, arange(n)) does.

  Up to PACKED_SORT_MAX items, one single-operand sort of the keys with their low bits
  replaced by the index (on XLA:CPU much faster than a key-value sort: see
  docs/benchmarks.md), then odd-even transposition passes that order items whose high
  bits tie by their full keys, until no neighbours are out of order (usually none or one
  pass): exact for any keys.
  """
  n = bits.shape[0]
  if n > PACKED_SORT_MAX:
    return jax.lax.sort_key_val(bits, jnp.arange(n))[1]
  shift = max(1, int(np.ceil(np.log2(n))))
  low = np.uint32((1 << shift) - 1)
  packed = (bits & ~low) | jnp.arange(n, dtype=jnp.uint32)
  order = (jnp.sort(packed) & low).astype(jnp.int32)
  pairs = jnp.arange(n - 1)

  def out_of_order(order):  # [n - 1]: neighbours p, p + 1 in the wrong order
    b = bits[order]
    return (b[1:] < b[:-1]) | ((b[1:] == b[:-1]) & (order[1:] < order[:-1]))

  def swap(order, parity):  # swaps the out-of-order pairs (p, p + 1) with p % 2 == parity
    wrong = out_of_order(order) & (pairs % 2 == parity)
    down = jnp.append(wrong, False)
    up = jnp.insert(wrong, 0, False)
    return jnp.where(down, jnp.roll(order, -1), jnp.where(up, jnp.roll(order, 1), order))

  return jax.lax.while_loop(lambda order: out_of_order(order).any(),
                            lambda order: swap(swap(order, 0), 1), order)


def sample_padded(key: jax.Array, max_clients: int, max_size: int, num_clients: jax.Array,
                  size: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(clients [max_size], mask [max_size]): a cohort of `size` of the first `num_clients`
  of max_clients clients (both traced, size <= max_size), for runs padded to a common
  client count so that they share one compiled program.

  The clients where mask is True are exactly sample_cohort(key, num_clients, size) (the
  same random bits, as jax.random.permutation draws them) whenever
  shuffle_rounds(num_clients) == shuffle_rounds(max_clients). With max_size == max_clients
  the clients are all of them in order and the mask marks the cohort.
  """
  index = jnp.arange(max_clients)
  order = index
  for _ in range(shuffle_rounds(max_clients)):
    key, subkey = jax.random.split(key)
    bits = jax.random.bits(subkey, (max_clients,), jnp.uint32)
    bits = jnp.where(index < num_clients, bits, jnp.uint32(np.iinfo(np.uint32).max))
    order = order[stable_argsort(bits)]
  order = jnp.where(size == num_clients, index[:max_size], order[:max_size])
  if max_size == max_clients:
    return index, jnp.zeros(max_clients, bool).at[order].set(index < size)
  return order, jnp.arange(max_size) < size


def sample_grouped(key: jax.Array, num_clients: int, size: int, groups: int,
                   group_ids: jax.Array | None = None) -> jax.Array:
  """Indices [g * size/groups] of a stratified cohort: clients are `groups` contiguous
  equal groups (num_clients/groups each) and group j draws size/groups of its clients
  uniformly without replacement with key fold_in(key, j).

  Every client is sampled with probability size/num_clients, and a group's draw needs only
  its own clients: a device holding groups `group_ids` (default all, g = groups) samples
  them without any cross-device gather, and the cohort does not depend on how the groups
  are spread over devices. num_clients and size must be multiples of `groups`.
  """
  if num_clients % groups or size % groups:
    raise ValueError(f"num_clients={num_clients} and cohort size={size} must be multiples of "
                     f"the number of client groups ({groups})")
  per_group, group_size = size // groups, num_clients // groups
  group_ids = jnp.arange(groups) if group_ids is None else group_ids

  def one(j):
    return j * group_size + sample_cohort(jax.random.fold_in(key, j), group_size, per_group)

  return jax.vmap(one)(group_ids).reshape(-1)
