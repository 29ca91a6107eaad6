"""The client axis over devices: a one-axis mesh named 'clients' and `shard_map` over it.

Per-client arrays ([n, ...]) are split into contiguous equal shards, one per device; a
round runs its clients' work locally on each device (a local `vmap`/scan over the
device's clients) and combines the aggregation sums with one `psum` over CLIENTS.
Under `jax.distributed.initialize()` `jax.devices()` spans every host, so the same mesh
spans hosts.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

CLIENTS = "clients"


def client_mesh(num_devices: int | None = None) -> Mesh:
  """A one-axis mesh named CLIENTS over the first `num_devices` devices (default all)."""
  devices = jax.devices()
  num_devices = len(devices) if num_devices is None else num_devices
  if not 1 <= num_devices <= len(devices):
    raise ValueError(f"num_devices must be in [1, {len(devices)}] (the devices JAX sees), got "
                     f"{num_devices}; emulate more CPU devices with XLA_FLAGS="
                     f"--xla_force_host_platform_device_count=N set before JAX starts")
  return Mesh(np.array(devices[:num_devices]), (CLIENTS,))


def check_devices(devices) -> None:
  """Raises ValueError unless `devices` is None or an integer >= 1."""
  if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int)
                              or devices < 1):
    raise ValueError(f"devices must be an integer >= 1 or None, got {devices!r}")


def check_divisible(num_clients: int, mesh: Mesh, what: str = "num_clients") -> None:
  """Raises ValueError unless `num_clients` splits evenly over the mesh's devices."""
  devices = mesh.shape[CLIENTS]
  if num_clients % devices:
    raise ValueError(f"{what}={num_clients} must be a multiple of the number of devices "
                     f"({devices}) to shard the client axis; pad the clients or use "
                     f"{devices * -(-num_clients // devices)}")


def shard_clients(tree, mesh: Mesh):
  """`tree` with every leaf's leading (client) axis split over the mesh's devices."""
  sharding = NamedSharding(mesh, PartitionSpec(CLIENTS))
  return jax.tree.map(lambda leaf: jax.device_put(leaf, sharding), tree)


def constrain_clients(tree, devices: int | None):
  """`tree` (inside jit) with every leaf's leading axis split over `devices` devices, as
  `over_clients` leaves its outputs, so that a loop's carry keeps one sharding from the
  first chunk on (no recompilation); unchanged for devices None or 1."""
  if devices is None or devices == 1:
    return tree
  sharding = NamedSharding(client_mesh(devices), PartitionSpec(CLIENTS))
  return jax.tree.map(lambda leaf: jax.lax.with_sharding_constraint(leaf, sharding), tree)


def over_clients(fn, devices: int | None, num_clients: int, client_args, client_specs, shared):
  """fn's (sums, outputs) over the client axis, split over `devices` devices.

  fn(index, client_args, shared) -> (sums, outputs) runs on one device's contiguous shard of
  the clients: index (int32) is the device's position on the mesh, so its first client is
  index * (its number of clients); `client_args` holds per-client leaves (split) and
  others (replicated) as `client_specs(PartitionSpec(CLIENTS))` says (a pytree prefix of
  client_args); `shared` is replicated. The sums are added over devices with one `psum`;
  outputs (leading axis: the device's clients) stay split. devices None or 1: fn runs once
  on all clients, without `shard_map`. num_clients (all devices) must split evenly.
  """
  check_devices(devices)
  if devices is None or devices == 1:
    return fn(jnp.int32(0), client_args, shared)
  mesh = client_mesh(devices)
  check_divisible(num_clients, mesh)
  split = PartitionSpec(CLIENTS)

  def local(client_args, shared):
    sums, outputs = fn(jax.lax.axis_index(CLIENTS), client_args, shared)
    return jax.lax.psum(sums, CLIENTS), outputs

  return jax.shard_map(local, mesh=mesh, in_specs=(client_specs(split), PartitionSpec()),
                       out_specs=(PartitionSpec(), split))(client_args, shared)
