"""Where a recipe's clients run: `devices` (the client axis split over that many devices,
across the processes of a job) and `cohort_groups` (the stratified cohort that makes the
numbers independent of the device count), settings every recipe has (`config.Config`).

A recipe's algorithms get them through `linear` and `neural`; `check` refuses, before any
work, a recipe whose algorithms cannot shard (naming the algorithm) and a device count
that the devices JAX sees cannot serve.
"""

import dataclasses
import math

import jax

from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.data import flat
from fedjax_rep.experiments import config as cfg

# The linear algorithms that shard (FedRep and its GD-GD variants); the others (local,
# FedAvg, FedAvg-FT, FLUTE, the timed schedules) run on one device.
LINEAR_SHARDED = ("fedrep", "gd-gd", "10gd-gd")


def device_count(config) -> int:
  """The number of devices of `config.devices` (all: every device JAX sees)."""
  return len(jax.devices()) if config.devices == "all" else config.devices


def laid_out(data, config):
  """`data` laid out for config's devices: a flat store (`data.flat.FlatClients`) in one
  block per device (`flat.for_devices`) where there are several; otherwise as it is."""
  devices = device_count(config)
  if devices > 1 and isinstance(data, flat.FlatClients):
    return flat.for_devices(data, devices)
  return data


def sharded(config) -> bool:
  """Whether `config` asks for more than one device or for cohort groups."""
  return config.devices != 1 or config.cohort_groups is not None


def check(config) -> None:
  """ConfigError unless `config`'s placement can run: devices at most those JAX sees,
  cohort_groups a multiple of devices, and, when sharded, every algorithm of
  config.algorithms able to shard (`Config.shard_refusal`), and none at all where the
  configuration's class sets UNSHARDED."""
  if not sharded(config):
    return
  devices = device_count(config)
  if devices > len(jax.devices()):
    raise cfg.ConfigError(
        f"devices={config.devices} is out of range: JAX sees {len(jax.devices())} devices "
        f"(emulate more CPU devices with XLA_FLAGS=--xla_force_host_platform_device_count=N, "
        f"or run a job of several processes); use devices=all or fewer")
  if config.cohort_groups is not None and config.cohort_groups % devices:
    raise cfg.ConfigError(f"cohort_groups={config.cohort_groups} must be a multiple of "
                          f"devices={devices} (every device holds the same number of groups)")
  asked = f"devices={config.devices}, cohort_groups={config.cohort_groups or 'auto'}"
  if type(config).UNSHARDED is not None:
    raise cfg.ConfigError(f"{type(config).UNSHARDED}: one device only, cannot run sharded "
                          f"({asked}); use devices=1 and cohort_groups=auto")
  for name in config.algorithms:
    reason = config.shard_refusal(name)
    if reason is not None:
      raise cfg.ConfigError(f"algorithm {name} cannot run sharded ({asked}): {reason}; drop "
                            f"it from algorithms or use devices=1 and cohort_groups=auto")
  check_counts(config, devices)


def check_counts(config, devices: int) -> None:
  """ConfigError unless every number of clients of `config` (num_clients, a number or a
  list) and its cohort (participation) split evenly over the cohort groups (default: one
  per device) and the clients over the devices; a configuration without these fields has
  none to check (participation 1)."""
  groups = config.cohort_groups or devices
  fields = vars(config)
  as_tuple = lambda value: value if isinstance(value, tuple) else (value,)
  for n in as_tuple(fields.get("num_clients", ())):
    for r in as_tuple(fields.get("participation", 1.0)):
      cohort = cohort_size(n, r) if n else None
      if n and (n % groups or n % devices or cohort % groups):
        raise cfg.ConfigError(
            f"num_clients={n} (cohort {cohort} at participation={r}) must split evenly: the "
            f"clients over devices={devices} and the {groups} cohort groups, the cohort over "
            f"the groups; choose num_clients and cohort_groups so (e.g. num_clients a "
            f"multiple of {groups * devices // math.gcd(groups, devices)})")


def keywords(config) -> dict:
  """The neural algorithms' keywords of `config`: devices (None for one) and
  cohort_groups."""
  devices = device_count(config)
  return {"devices": None if devices == 1 else devices, "cohort_groups": config.cohort_groups}


def linear(algorithm, config):
  """The linear FedRep `algorithm` with `config`'s devices and cohort groups (its
  client_groups)."""
  if not sharded(config):
    return algorithm
  devices = device_count(config)
  return dataclasses.replace(algorithm, devices=None if devices == 1 else devices,
                             client_groups=config.cohort_groups)
