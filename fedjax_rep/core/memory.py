"""The memory a run may use: what the allocator of an accelerator reports free, else the
host's available memory."""

import contextlib
import os

import jax

USABLE = 0.9  # the fraction of the available memory that a run plans to use


def device_stats(devices: int = 1, key: str = "bytes_limit") -> list[dict] | None:
  """The allocator's memory statistics (`Device.memory_stats()`) of the first `devices`
  devices of an accelerator (jax's default backend not the CPU), or None on the CPU or
  where one of them does not report `key`."""
  if jax.default_backend() == "cpu":
    return None
  stats = [device.memory_stats() or {} for device in jax.devices()[:devices]]
  return stats if all(key in s for s in stats) else None


def available_bytes(devices: int = 1) -> int:
  """Memory available to a new allocation now: on an accelerator whose allocator reports
  it, the free memory (limit less in use) of its first `devices` devices together
  (`device_stats`); else MemAvailable of /proc/meminfo, else the free physical pages
  (os.sysconf)."""
  stats = device_stats(devices)
  if stats is not None:
    return sum(s["bytes_limit"] - s.get("bytes_in_use", 0) for s in stats)
  with contextlib.suppress(OSError), open("/proc/meminfo") as f:
    for line in f:
      if line.startswith("MemAvailable:"):
        return int(line.split()[1]) * 1024
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
