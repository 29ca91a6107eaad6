"""The neural round and evaluation with the client axis sharded over devices.

With `devices` set, an algorithm's round runs under `shard_map` over
`core.sharding.client_mesh`: device d holds the contiguous shard [d n/D, (d+1) n/D) of the
clients' data and personal params, the shared params and the server state are
replicated, the cohort is drawn stratified over `cohort_groups` contiguous groups of
clients (`cohort.sample_grouped`), each device drawing, training and updating only its
own groups' clients, and the server's weighted sums are combined by one `psum` over the
devices (`Personalized.cohort_sum`). The groups, not the devices, fix the cohorts, so any
device count that divides `cohort_groups` gives the numbers of devices=None with the same
`cohort_groups` (up to float32 summation order).
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core import sharding
from fedjax_rep.data import flat

# Leading (client) axis split over the client mesh's devices.
BY_CLIENT = PartitionSpec(sharding.CLIENTS)


def state_specs(state_type):
  """How a `state_type` (NNState) lies on the mesh: personal params, the untrained and
  cohort masks split by client, the rest replicated (a pytree prefix, as shard_map takes)."""
  return state_type(shared=PartitionSpec(), personal=BY_CLIENT, eval_key=PartitionSpec(),
                    server=PartitionSpec(), round=PartitionSpec(), untrained=BY_CLIENT,
                    cohort=BY_CLIENT)


def cohort_groups(algorithm) -> int | None:
  """The cohort's groups: cohort_groups, else one per device (None: unstratified)."""
  return algorithm.cohort_groups if algorithm.cohort_groups is not None else algorithm.devices


def refusal(cls: type) -> str | None:
  """Why the rounds of algorithm class `cls` (a `Personalized` subclass) cannot shard
  (None: they can): a `masked_round` that adds steps over the whole cohort."""
  if cls.overrides("masked_round"):
    return "its masked_round adds steps over the whole cohort"
  return None


def check(algorithm, num_clients: int) -> None:
  """Raises ValueError unless `devices` and `cohort_groups` are None or integers >= 1 that
  fit: devices at most the devices JAX sees, cohort_groups a multiple of devices,
  num_clients and cohort multiples of cohort_groups, and the round shardable (`refusal`)."""
  for name, value in (("devices", algorithm.devices),
                      ("cohort_groups", algorithm.cohort_groups)):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
      raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
  groups, devices = cohort_groups(algorithm), algorithm.devices
  if devices is not None:
    mesh = sharding.client_mesh(devices)
    if refusal(type(algorithm)) is not None:
      raise ValueError(f"{algorithm.name} cannot run sharded (devices={devices}): "
                       f"{refusal(type(algorithm))}; use devices=None")
    if groups % devices:
      raise ValueError(f"cohort_groups={groups} must be a multiple of devices={devices} "
                       f"(every device holds the same number of groups)")
    sharding.check_divisible(num_clients, mesh)
  if groups is not None and (num_clients % groups or algorithm.cohort % groups):
    raise ValueError(f"num_clients={num_clients} and cohort={algorithm.cohort} must be "
                     f"multiples of the cohort groups ({groups}): each group holds "
                     f"num_clients/{groups} clients and draws cohort/{groups} of them")


def place(algorithm, state):
  """`state` laid out on the client mesh as `state_specs` says (unchanged unsharded)."""
  if algorithm.devices is None:
    return state
  mesh = sharding.client_mesh(algorithm.devices)
  return jax.lax.with_sharding_constraint(state, jax.tree.map(
      lambda spec: NamedSharding(mesh, spec), state_specs(type(state)),
      is_leaf=lambda x: isinstance(x, PartitionSpec)))


def check_data(algorithm, data) -> None:
  """Raises ValueError unless a flat store (`data.flat.FlatClients`) is laid out for the
  devices `algorithm` runs on: in one block unsharded, in `devices` blocks sharded."""
  if not isinstance(data, flat.FlatClients) or data.blocks == (algorithm.devices or 1):
    return
  if algorithm.devices is None:
    raise ValueError(f"the data's store is laid out for {data.blocks} devices "
                     f"(`flat.for_devices`) but {algorithm.name} runs on one (devices=None): "
                     f"use devices={data.blocks} or data not laid out for devices")
  raise ValueError(f"{algorithm.name} runs on devices={algorithm.devices} but the data's flat "
                   f"store is laid out for {data.blocks}: lay it out with "
                   f"flat.for_devices(data, {algorithm.devices})")


def device_part(data):
  """This device's part of `data` inside a shard_map over the client mesh: a flat store's
  block as a store of its own; padded data as they are."""
  return data.replace(blocks=1) if isinstance(data, flat.FlatClients) else data


def device_offset(held: int) -> jax.Array:
  """The global index [] of the first client of this device, inside a shard_map over the
  client mesh whose devices hold `held` clients each."""
  return jax.lax.axis_index(sharding.CLIENTS) * held


def round(algorithm, state, key_cohort, key_clients, data, hparams):
  """`algorithm`'s round sharded, as two shard_maps: each device draws its own groups' part
  of the cohort and trains it (`train_clients`), then the server's step (`server_step`)
  sums over the devices and must leave the shared params, server state and metrics the
  same on all of them (a ValueError otherwise: a server step that sums without
  `cohort_sum`). Returns (state after the server step, the cohort's clients [c], their
  weights [c], the round's metrics)."""
  num_clients, groups = data.num_clients, cohort_groups(algorithm)
  specs = state_specs(type(state))
  info = algorithm.round_info(state, num_clients)

  def local(state, data):  # this device's clients: offset + range(data.num_clients)
    data = device_part(data)
    offset = device_offset(data.num_clients)
    group_ids = offset // (num_clients // groups) + jnp.arange(groups // algorithm.devices)
    clients = cohort_lib.sample_grouped(key_cohort, num_clients, algorithm.cohort, groups,
                                        group_ids)
    return (*algorithm.train_clients(state, key_clients, data, hparams, clients - offset,
                                     clients, info), clients)

  def server(shared, sent, weights, losses):
    return algorithm.server_step(shared, sent, weights, losses, hparams, info)

  mesh = sharding.client_mesh(algorithm.devices)
  # check_vma off for training: its scans start from replicated carries (SGD's params,
  # loss totals) that become per-device, which JAX's varying-axes types would reject.
  state, sent, weights, losses, clients = jax.shard_map(
      local, mesh=mesh, in_specs=(specs, BY_CLIENT),
      out_specs=(specs, BY_CLIENT, BY_CLIENT, BY_CLIENT, BY_CLIENT),
      check_vma=False)(state, data)
  try:  # check_vma on: JAX proves the server's outputs the same on every device
    (shared, server_state), metrics = jax.shard_map(
        server, mesh=mesh, in_specs=(PartitionSpec(), BY_CLIENT, BY_CLIENT, BY_CLIENT),
        out_specs=((PartitionSpec(), PartitionSpec()), PartitionSpec()))(
            state.shared, sent, weights, losses)
  except ValueError as error:  # JAX's message: out_specs "require replication" ...
    if "replicat" not in str(error):
      raise
    raise ValueError(f"{algorithm.name} cannot run sharded (devices={algorithm.devices}): "
                     f"its server step combines the cohort's values without `cohort_sum` "
                     f"(a psum over the devices), so the devices would disagree on the "
                     f"shared params; use devices=None") from error
  return state.replace(shared=shared, server=server_state), clients, weights, metrics


def tested(algorithm, tested_fn, state, data):
  """tested_fn(state, data, offset) (each client's `train.tested`, [n]) with each device
  testing the clients it holds (one shard_map; check_vma off: fine-tuning's scans)."""
  def local(state, data):
    data = device_part(data)
    return tested_fn(state, data, device_offset(data.num_clients))

  return jax.shard_map(local, mesh=sharding.client_mesh(algorithm.devices),
                       in_specs=(state_specs(type(state)), BY_CLIENT), out_specs=BY_CLIENT,
                       check_vma=False)(state, data)
