"""Synthetic(alpha, beta): the federated classification benchmark of FedProx (Li et al.,
"Federated Optimization in Heterogeneous Networks", Sec. 5.1) and LEAF's data/synthetic.

Client k has its own softmax model (W_k, b_k) and input mean v_k; alpha sets how much the
models differ across clients and beta how much the inputs do. Everything is a deterministic
function of the seed.
"""

import numpy as np

from fedjax_rep.data import flat
from fedjax_rep.data.federated import ClientDatasets, client_datasets

SIZE_MEAN, SIZE_SIGMA, SIZE_MIN = 4.0, 2.0, 50  # client sizes: int(lognormal(4, 2)) + 50
COV_EXPONENT = -1.2  # input covariance: diagonal with entries j**-1.2, j = 1..dim


def _check(alpha, beta, num_clients, dim, num_classes, max_samples):
  """Raises a ValueError naming the first argument out of its range."""
  for name, value in (("alpha", alpha), ("beta", beta)):
    if not value >= 0 or not np.isfinite(value):
      raise ValueError(f"{name} must be a finite number >= 0, got {value}")
  for name, value, least in (("num_clients", num_clients, 1), ("dim", dim, 1),
                             ("num_classes", num_classes, 2)):
    if not isinstance(value, (int, np.integer)) or value < least:
      raise ValueError(f"{name} must be an integer >= {least}, got {value}")
  if max_samples is not None and (not isinstance(max_samples, (int, np.integer))
                                  or max_samples < 2):
    raise ValueError(f"max_samples must be None or an integer >= 2, got {max_samples}")


def generate(alpha: float, beta: float, num_clients: int, seed: int, dim: int = 60,
             num_classes: int = 10, max_samples: int | None = None) -> dict:
  """The clients' models and samples of Synthetic(alpha, beta), as in FedProx's generator.

  For client k = 0..n-1 (n = num_clients, C = num_classes, d = dim):
    u_k ~ N(0, alpha^2), B_k ~ N(0, beta^2) (FedProx's code takes alpha and beta as standard
      deviations, `np.random.normal(0, alpha)`, though the paper writes N(0, alpha));
    W_k [C, d] and b_k [C] with entries ~ N(u_k, 1); v_k [d] with entries ~ N(B_k, 1);
    m_k = int(LogNormal(4, 2)) + 50 samples, capped at max_samples (None: no cap);
    x ~ N(v_k, diag(j^-1.2, j = 1..d)) and y = argmax softmax(W_k x + b_k).
  Returns {"W": [n, C, d], "b": [n, C], "v": [n, d], "u": [n], "B": [n]} (float64),
  "x_rows" [sum_k m_k, d] (float32) and "y_rows" [sum_k m_k] (int32), every client's
  samples one after another, and "x", "y": the n clients' views [m_k, d], [m_k] of them;
  the labels are computed from the float32 x.
  """
  _check(alpha, beta, num_clients, dim, num_classes, max_samples)
  rng = np.random.default_rng(seed)
  sizes = rng.lognormal(SIZE_MEAN, SIZE_SIGMA, num_clients).astype(np.int64) + SIZE_MIN
  if max_samples is not None:
    sizes = np.minimum(sizes, max_samples)
  u = rng.normal(0.0, alpha, num_clients)
  big_b = rng.normal(0.0, beta, num_clients)
  v = rng.normal(big_b[:, None], 1.0, (num_clients, dim))
  w = rng.normal(u[:, None, None], 1.0, (num_clients, num_classes, dim))
  b = rng.normal(u[:, None], 1.0, (num_clients, num_classes))
  scale = np.sqrt(np.arange(1, dim + 1, dtype=np.float64) ** COV_EXPONENT)
  x_rows = flat.aligned_empty((int(sizes.sum()), dim), np.float32)
  y_rows = np.empty(int(sizes.sum()), np.int32)
  ends = np.cumsum(sizes)
  for k, (start, end) in enumerate(zip(ends - sizes, ends)):
    x_rows[start:end] = rng.normal(v[k], scale, (end - start, dim))
    y_rows[start:end] = np.argmax(x_rows[start:end].astype(np.float64) @ w[k].T + b[k], axis=1)
  return {"W": w, "b": b, "v": v, "u": u, "B": big_b, "x_rows": x_rows, "y_rows": y_rows,
          "x": np.split(x_rows, ends[:-1]), "y": np.split(y_rows, ends[:-1])}


def federated(alpha: float, beta: float, num_clients: int, seed: int, dim: int = 60,
              num_classes: int = 10, max_samples: int | None = None,
              test_fraction: float = 0.1,
              layout: str = "flat") -> flat.FlatClients | ClientDatasets:
  """Synthetic(alpha, beta) (see `generate`): client k's first
  clip(int((1 - test_fraction) m_k), 1, m_k - 1) samples train and the rest test (LEAF's
  90/10 split by default). layout "flat": FlatClients whose store is `generate`'s rows
  (float32 x [N, dim], int32 y [N]; memory of the samples alone); "padded": ClientDatasets
  padded to x [n, m, dim] and x_test [n, t, dim] (m, t: the largest client)."""
  if not 0 < test_fraction < 1:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
  if layout not in ("flat", "padded"):
    raise ValueError(f"layout must be 'flat' or 'padded', got {layout!r}")
  _check(alpha, beta, num_clients, dim, num_classes, max_samples)
  data = generate(alpha, beta, num_clients, seed, dim, num_classes, max_samples)
  sizes = np.array([len(y) for y in data["y"]])
  train_sizes = np.clip((sizes * (1 - test_fraction)).astype(np.int64), 1, sizes - 1)
  x, y = data.pop("x_rows"), data.pop("y_rows")
  starts = np.cumsum(sizes) - sizes
  if layout == "flat":
    del data
    return flat.segments(x, y, starts, train_sizes, starts + train_sizes, sizes - train_sizes,
                         num_classes)
  parts = [np.arange(s, s + t) for s, t in zip(starts, train_sizes)]
  test_parts = [np.arange(s + t, s + m) for s, t, m in zip(starts, train_sizes, sizes)]
  return client_datasets(x, y, parts, x, y, test_parts, num_classes=num_classes)
