"""Synthetic(alpha, beta): its statistics match FedProx's definition, its splits LEAF's."""

import numpy as np
import pytest

from fedjax_rep.data import synthetic

CLIENTS = 1000
CAP = 60  # few samples per client keep the statistics tests fast
D, C = 60, 10


@pytest.fixture(scope="module")
def data():
  """Synthetic(a, a) of CLIENTS clients for a in 0, 0.5 and 1."""
  return {a: synthetic.generate(a, a, CLIENTS, seed=0, max_samples=CAP) for a in (0.0, 0.5, 1.0)}


def test_shapes_and_types(data):
  d = data[0.5]
  assert d["W"].shape == (CLIENTS, C, D) and d["b"].shape == (CLIENTS, C)
  assert d["v"].shape == (CLIENTS, D) and d["u"].shape == d["B"].shape == (CLIENTS,)
  assert len(d["x"]) == len(d["y"]) == CLIENTS
  for x, y in zip(d["x"], d["y"]):
    assert x.shape == (len(y), D) and x.dtype == np.float32 and y.dtype == np.int32


@pytest.mark.parametrize("a", [0.0, 0.5, 1.0])
def test_model_and_input_means_spread_with_alpha_and_beta(data, a):
  d = data[a]
  # u_k ~ N(0, a^2) and the mean of W_k's C*D entries ~ N(u_k, 1 / (C*D)); likewise B, v.
  np.testing.assert_allclose(d["u"].std(), a, rtol=0.1)
  np.testing.assert_allclose(d["B"].std(), a, rtol=0.1)
  np.testing.assert_allclose(d["W"].mean((1, 2)).std(), np.hypot(a, 1 / np.sqrt(C * D)),
                             rtol=0.1)
  np.testing.assert_allclose(d["b"].mean(1).std(), np.hypot(a, 1 / np.sqrt(C)), rtol=0.1)
  np.testing.assert_allclose(d["v"].mean(1).std(), np.hypot(a, 1 / np.sqrt(D)), rtol=0.1)
  # Around their client's mean, the entries have unit variance whatever a is.
  np.testing.assert_allclose((d["W"] - d["u"][:, None, None]).std(), 1, rtol=0.05)
  np.testing.assert_allclose((d["v"] - d["B"][:, None]).std(), 1, rtol=0.05)


def test_spread_grows_with_alpha_and_beta(data):
  w_spread = [data[a]["W"].mean((1, 2)).std() for a in (0.0, 0.5, 1.0)]
  v_spread = [data[a]["v"].mean(1).std() for a in (0.0, 0.5, 1.0)]
  assert w_spread == sorted(w_spread) and v_spread == sorted(v_spread)


def test_zero_zero_has_no_client_shift(data):
  d = data[0.0]
  assert not d["u"].any() and not d["B"].any()
  assert d["W"][0].std() > 0.5 and not np.allclose(d["W"][0], d["W"][1])  # still N(0, 1)


def test_inputs_have_the_diagonal_covariance(data):
  d = data[1.0]
  residuals = np.concatenate([x - v for x, v in zip(d["x"], d["v"])])  # [sum m_k, D]
  expected = np.arange(1, D + 1) ** -1.2
  np.testing.assert_allclose(residuals.var(0), expected, rtol=0.05)
  np.testing.assert_allclose(residuals.mean(0), 0, atol=0.05)
  off = np.corrcoef(residuals.T)[np.triu_indices(D, 1)]
  assert np.abs(off).max() < 0.05


def test_labels_are_the_argmax_of_the_clients_own_model(data):
  for a in (0.0, 1.0):
    d = data[a]
    for x, y, w, b in zip(d["x"], d["y"], d["W"], d["b"]):
      logits = x.astype(np.float64) @ w.T + b
      np.testing.assert_array_equal(y, logits.argmax(1))
    assert len(np.unique(np.concatenate(d["y"]))) == C


def test_client_sizes_are_lognormal_plus_50():
  cap = 400  # above the sizes' upper quartile, so the quartiles are uncapped
  sizes = np.array([len(y) for y in synthetic.generate(1.0, 1.0, 1000, 1, max_samples=cap)["y"]])
  assert sizes.min() >= 50 and sizes.max() == cap
  # int(LogNormal(4, 2)) has quartiles exp(4 -+ 2 * 0.674).
  log_q = np.log(np.percentile(sizes - 50, [25, 50, 75]))
  assert abs(log_q[1] - 4) < 0.3
  assert abs((log_q[2] - log_q[0]) / (2 * 0.6745) - 2) < 0.3
  uncapped = [len(y) for y in synthetic.generate(1.0, 1.0, 30, 1)["y"]]
  np.testing.assert_array_equal(np.minimum(uncapped, cap), sizes[:30])  # the cap only clips


def test_federated_splits_each_client_90_10():
  d = synthetic.generate(0.5, 0.5, 20, 3, max_samples=200)
  fed = synthetic.federated(0.5, 0.5, 20, 3, max_samples=200, layout="padded")
  sizes = np.array([len(y) for y in d["y"]])
  counts, test_counts = np.asarray(fed.counts), np.asarray(fed.test_counts)
  np.testing.assert_array_equal(counts, (0.9 * sizes).astype(int))
  np.testing.assert_array_equal(counts + test_counts, sizes)
  assert fed.x.shape == (20, counts.max(), D) and fed.x_test.shape == (20, test_counts.max(), D)
  assert fed.x.dtype == np.float32 and fed.y.dtype == np.int32 and fed.num_classes == C
  x, y = np.asarray(fed.x), np.asarray(fed.y)
  x_test, y_test = np.asarray(fed.x_test), np.asarray(fed.y_test)
  for k in range(20):
    n, t = counts[k], test_counts[k]
    np.testing.assert_array_equal(x[k, :n], d["x"][k][:n])
    np.testing.assert_array_equal(y[k, :n], d["y"][k][:n])
    np.testing.assert_array_equal(x_test[k, :t], d["x"][k][n:])
    np.testing.assert_array_equal(y_test[k, :t], d["y"][k][n:])
    assert not x[k, n:].any() and not x_test[k, t:].any()
  store = synthetic.federated(0.5, 0.5, 20, 3, max_samples=200)  # flat: the samples once
  np.testing.assert_array_equal(store.counts, counts)
  np.testing.assert_array_equal(store.test_counts, test_counts)
  assert store.x.shape == (sizes.sum(), D) and store.x.dtype == np.float32
  np.testing.assert_array_equal(store.x, np.concatenate(d["x"]))
  np.testing.assert_array_equal(store.y, np.concatenate(d["y"]))
  np.testing.assert_array_equal(store.offsets, np.cumsum(sizes) - sizes)
  np.testing.assert_array_equal(store.test_offsets, np.cumsum(sizes) - sizes + counts)


@pytest.mark.parametrize("max_samples, test_fraction", [(2, 0.1), (2, 0.9), (60, 0.99)])
def test_every_client_keeps_a_train_and_a_test_sample(max_samples, test_fraction):
  fed = synthetic.federated(0.0, 0.0, 5, 0, max_samples=max_samples,
                            test_fraction=test_fraction)
  assert np.asarray(fed.counts).min() >= 1 and np.asarray(fed.test_counts).min() >= 1
  np.testing.assert_array_equal(fed.counts + fed.test_counts,
                                np.full(5, max_samples))


def test_deterministic_from_the_seed():
  def arrays(seed):
    d = synthetic.generate(0.5, 1.0, 8, seed, dim=5, num_classes=3, max_samples=100)
    return [d[k] for k in ("W", "b", "v", "u", "B")] + d["x"] + d["y"]

  first, again, other = arrays(7), arrays(7), arrays(8)
  assert all(np.array_equal(a, b) for a, b in zip(first, again))
  assert not any(np.array_equal(a, b) for a, b in zip(first[:5], other[:5]))
  fed, fed_again = (synthetic.federated(1.0, 1.0, 4, 2, max_samples=100) for _ in range(2))
  assert np.array_equal(fed.x, fed_again.x) and np.array_equal(fed.y, fed_again.y)


def test_dim_and_num_classes():
  d = synthetic.generate(1.0, 1.0, 3, 0, dim=7, num_classes=2, max_samples=50)
  assert d["W"].shape == (3, 2, 7) and d["x"][0].shape == (50, 7)
  assert set(np.concatenate(d["y"])) <= {0, 1}


@pytest.mark.parametrize("kwargs, match", [
    (dict(alpha=-0.1), "alpha must be a finite number >= 0, got -0.1"),
    (dict(alpha=float("nan")), "alpha must be a finite number >= 0"),
    (dict(beta=float("inf")), "beta must be a finite number >= 0"),
    (dict(num_clients=0), "num_clients must be an integer >= 1, got 0"),
    (dict(num_clients=2.5), "num_clients must be an integer >= 1"),
    (dict(dim=0), "dim must be an integer >= 1"),
    (dict(num_classes=1), "num_classes must be an integer >= 2"),
    (dict(max_samples=1), "max_samples must be None or an integer >= 2, got 1"),
    (dict(test_fraction=0.0), r"test_fraction must be in \(0, 1\), got 0.0"),
    (dict(test_fraction=1.0), r"test_fraction must be in \(0, 1\)"),
])
def test_clear_errors(kwargs, match):
  args = dict(alpha=0.5, beta=0.5, num_clients=4, seed=0) | kwargs
  with pytest.raises(ValueError, match=match):
    synthetic.federated(**args)
  if "test_fraction" not in kwargs:
    with pytest.raises(ValueError, match=match):
      synthetic.generate(**args)
