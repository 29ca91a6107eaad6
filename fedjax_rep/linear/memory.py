"""How much memory a linear FedRep run needs, and a check before any work that it fits.

`estimate` gives bytes by component for n clients, d, k, m and a data mode ("fixed",
"fresh" = direct fresh samples, "fresh-statistics"); `check` raises a one-line ValueError
when the total exceeds the memory available (MemAvailable on the CPU, the devices' free
memory on an accelerator), naming the sizes and what to change. Per-client state is O(n k)
(heads, ground-truth heads W*); with fresh data nothing else grows with n: clients run in
blocks (`blocks.block_size`), whose temporaries are O(block).
"""

from fedjax_rep.core.memory import USABLE, available_bytes
from fedjax_rep.linear import blocks

MODES = ("fixed", "fresh", "fresh-statistics")
FLOAT = 4  # bytes of a float32
# Calibrated on peak RSS of benchmarks/scale.py runs (d=50, k=5, m=10, 1e5..1e7 clients).
RUNTIME_BYTES = 650 << 20  # Python, JAX, XLA and compiled programs (0.6-0.7 GB at 1e5)
DEVICE_BYTES = 35 << 20  # each further emulated device's runtime
HEAD_COPIES = 5  # [n, k]: init, the run's copy, the carry, the new heads, the finite select
SHARDED_HEAD_COPIES = 3  # more [n, k] copies when resharding over devices > 1
BLOCK_COPIES = 4  # a block's design and labels: drawn or sliced, copied, products, residuals


def estimate(num_clients: int, dim: int, rep_dim: int, samples: int, mode: str = "fresh", *,
             block: int | None = None, devices: int = 1, test_samples: int = 0) -> dict:
  """Bytes by component of a FedRep run with full participation (partial needs less).

  Args:
    num_clients: n.
    dim: d.
    rep_dim: k.
    samples: m, the samples per client.
    mode: the data mode, one of MODES ("fixed", "fresh", "fresh-statistics").
    block: clients per block; None: `blocks.block_size`'s default.
    devices: devices the clients are sharded over.
    test_samples: test samples per client (fixed data).

  Returns:
    A dict of bytes: 'data' (fixed: X [n, m, d] and y [n, m], plus test samples),
    'ground_truth' (W* [n, k]), 'heads' (copies of [n, k] arrays), 'blocks' (each device's
    block temporaries), 'runtime' (the process itself), and 'total' (their sum). Measured
    peaks were within ~15% of the total (benchmarks/scale.py).

  Raises:
    ValueError: an unknown mode, or a size that is not an integer >= 1.
  """
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
  for name, value in (("num_clients", num_clients), ("dim", dim), ("rep_dim", rep_dim),
                      ("samples", samples), ("devices", devices)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
  width = 2 * rep_dim if mode == "fresh-statistics" else dim  # p: a client's design width
  client_bytes = FLOAT * samples * (width + 1)
  local = -(-num_clients // devices)
  init_block = blocks.block_size(local, FLOAT * samples * (dim + 1), block)
  round_block = blocks.block_size(local, client_bytes, block, read=mode == "fixed")
  block_bytes = max(init_block * FLOAT * samples * (dim + 1), round_block * client_bytes)
  parts = {
      "data": (FLOAT * num_clients * (samples + test_samples) * (dim + 1)
               if mode == "fixed" else 0),
      "ground_truth": FLOAT * num_clients * rep_dim,
      "heads": (HEAD_COPIES + (SHARDED_HEAD_COPIES if devices > 1 else 0)) * FLOAT
               * num_clients * rep_dim,
      "blocks": devices * BLOCK_COPIES * block_bytes,
      "runtime": RUNTIME_BYTES + (devices - 1) * DEVICE_BYTES,
  }
  return {**parts, "total": sum(parts.values())}


def describe(parts: dict) -> str:
  """'total 1.23 GB (data 0.00 GB, ground_truth ...)': an estimate in one line."""
  details = ", ".join(f"{name} {value / 1e9:.2f} GB" for name, value in parts.items()
                      if name != "total")
  return f"total {parts['total'] / 1e9:.2f} GB ({details})"


def check(num_clients: int, dim: int, rep_dim: int, samples: int, mode: str = "fresh", *,
          block: int | None = None, devices: int = 1, test_samples: int = 0,
          available: int | None = None) -> dict:
  """`estimate(...)`, after checking that its total fits the memory available.

  Args:
    num_clients: n, as in `estimate`.
    dim: d.
    rep_dim: k.
    samples: m, the samples per client.
    mode: the data mode, one of MODES.
    block: clients per block, as in `estimate`.
    devices: devices the clients are sharded over.
    test_samples: test samples per client (fixed data).
    available: the bytes available; default `available_bytes(devices)`.

  Returns:
    The dict of `estimate`.

  Raises:
    ValueError: (one line) the total exceeds USABLE (90%) of `available`.
  """
  parts = estimate(num_clients, dim, rep_dim, samples, mode, block=block, devices=devices,
                   test_samples=test_samples)
  available = available_bytes(devices) if available is None else available
  if parts["total"] > USABLE * available:
    advice = ("use fresh data (FreshData, data_mode='fresh'), fewer clients or fewer samples"
              if mode == "fixed" else "use fewer clients or a smaller block")
    raise ValueError(
        f"{num_clients} clients x {samples} samples x dim {dim} (rep_dim {rep_dim}, {mode} "
        f"data) need about {describe(parts)}, more than {USABLE:.0%} of the "
        f"{available / 1e9:.2f} GB available: "
        f"{advice}")
  return parts
