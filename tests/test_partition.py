import numpy as np
import pytest

from fedjax_rep.data import digits, partition

CLIENTS = 20
S = 2


@pytest.fixture(scope="module")
def labels():
  rng = np.random.default_rng(123)
  return rng.integers(0, 10, 1000), rng.integers(0, 10, 300)


def split(name, labels, seed=0):
  return partition.partition(name, *labels, num_clients=CLIENTS, seed=seed,
                             classes_per_client=S, dirichlet_alpha=0.5)


def assert_disjoint(parts, n):
  """The parts are int64 arrays of valid indices into n samples, no index in two parts."""
  assert all(p.dtype == np.int64 and p.ndim == 1 for p in parts)
  flat = np.concatenate(parts)
  assert np.all((flat >= 0) & (flat < n))
  assert len(np.unique(flat)) == len(flat)


@pytest.mark.parametrize("name", sorted(partition.PARTITIONS))
def test_parts_are_disjoint_valid_and_deterministic(name, labels):
  train, test = split(name, labels)
  assert len(train) == len(test) == CLIENTS
  assert_disjoint(train, len(labels[0]))
  assert_disjoint(test, len(labels[1]))
  again, again_test = split(name, labels)
  assert all(np.array_equal(a, b) for a, b in zip(train + test, again + again_test))
  other, _ = split(name, labels, seed=1)
  assert not all(np.array_equal(a, b) for a, b in zip(train, other))


def rows_of(parts, labels, shard):
  """[clients, C] how often each client holds each class, from parts whose shards all have
  `shard` samples (hand-made labels with a multiple of the shard count per class)."""
  counts = np.stack([np.bincount(labels[p], minlength=labels.max() + 1) for p in parts])
  assert np.all(counts % shard == 0)
  return counts // shard


def test_classes_is_fedreps_shard_scheme():
  """Hand-made labels: 10 classes of 40 train and 12 test samples, 20 clients with S = 3
  slots, so 6 shards per class of 40/6 train (6 or 7: the remainder to the first shards)
  and 2 test samples. Every sample is used once, each client's labels are its row (S
  shards, a class possibly twice), every class fills n S / C slots, and the test split
  follows the same rows."""
  y, y_test = np.repeat(np.arange(10), 40), np.repeat(np.arange(10), 12)
  train, test = partition.classes(y, y_test, num_clients=20, classes_per_client=3, seed=0)
  assert sum(map(len, train)) == len(y) and sum(map(len, test)) == len(y_test)
  held = rows_of(test, y_test, 2)  # test shards are exactly 2 samples each
  assert np.all(held.sum(axis=1) == 3) and np.all(held.sum(axis=0) == 6)
  for p, row in zip(train, held):
    counts = np.bincount(y[p], minlength=10)
    assert np.all((counts == 0) == (row == 0))
    # one shard of a class is 6 or 7 samples: the sizes FedRep's leftover rule gives
    assert np.all((counts >= 6 * row) & (counts <= 7 * row))
  # FedRep's shards are runs of a class's samples in their order (plus one leftover each)
  first = np.flatnonzero(y == 0)
  shards = sorted(np.sort(p[y[p] == 0]).tolist() for p in train if (y[p] == 0).any())
  assert any(s[:6] == first[:6].tolist() for s in shards)
  assert (held == 2).any()  # 20 rows of 3 from a pool of 60: some row draws a class twice


def test_classes_gives_random_class_sets(labels):
  """The distinct class sets over seeds are those of random rows of FedRep's pool (their
  mean count over 40 seeds within 2 of a direct simulation of the pool), not the few of a
  cyclic window (C / gcd(S, C) = 5 here)."""
  y, _ = labels
  def distinct(parts):
    return len({frozenset(y[p]) for p in parts})
  counts = [distinct(split("classes", labels, seed=s)[0]) for s in range(40)]
  rng = np.random.default_rng(1)
  pools = [rng.permutation(np.tile(np.arange(10), CLIENTS * S // 10)).reshape(CLIENTS, S)
           for _ in range(2000)]
  expected = np.mean([len({frozenset(r) for r in rows}) for rows in pools])
  assert expected > 10 and abs(np.mean(counts) - expected) < 2


def test_classes_uneven_pool(labels):
  """C not dividing n S: n S mod C classes hold one slot more; every slot one shard."""
  y, _ = labels
  train, _ = partition.classes(*labels, num_clients=7, classes_per_client=3, seed=0)
  holders = np.bincount(np.concatenate([np.unique(y[p]) for p in train]), minlength=10)
  assert 1 <= holders.min() and holders.max() <= 3 and holders.sum() <= 21
  assert all(1 <= len(set(y[p])) <= 3 for p in train)
  assert sum(map(len, train)) == len(y)


def test_dirichlet_min_samples_and_test_classes(labels):
  y, y_test = labels
  train, test = partition.dirichlet(*labels, num_clients=CLIENTS, alpha=0.1, seed=0,
                                    min_samples=5)
  assert min(map(len, train)) >= 5
  assert all(set(y_test[q]) <= set(y[p]) for p, q in zip(train, test))
  assert sum(map(len, train)) == len(y) and sum(map(len, test)) == len(y_test)


def test_iid_sizes_differ_by_at_most_one(labels):
  train, test = split("iid", labels)
  for parts in (train, test):
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="shards"), "partition must be one of"),
    (dict(num_clients=0), r"num_clients must be in \[1, 1000\]"),
    (dict(num_clients=1001), r"num_clients must be in \[1, 1000\]"),
    (dict(classes_per_client=11), r"classes_per_client must be in \[1, 10\]"),
    (dict(classes_per_client=0), r"classes_per_client must be in \[1, 10\]"),
    (dict(name="dirichlet", dirichlet_alpha=0.0), "dirichlet_alpha must be .* > 0"),
    (dict(name="dirichlet", num_clients=600), r"min_samples must be in \[0, 1\]"),
    (dict(name="iid", num_clients=2.5), "num_clients must be"),
])
def test_clear_errors(kwargs, match, labels):
  args = dict(name="classes", num_clients=CLIENTS, seed=0) | kwargs
  with pytest.raises(ValueError, match=match):
    partition.partition(args.pop("name"), *labels, **args)


def test_errors_on_bad_labels_and_impossible_splits():
  with pytest.raises(ValueError, match="train_labels must be a 1-D integer array"):
    partition.iid(np.zeros((4, 2), np.int64), np.zeros(2, np.int64), 2, seed=0)
  y = np.array([0] * 50 + [1] * 2)
  with pytest.raises(ValueError, match="class 1 has 2 train samples but 5 shards"):
    partition.classes(y, y, num_clients=10, classes_per_client=1, seed=0)
  with pytest.raises(ValueError, match="use fewer clients or a larger alpha"):
    partition.dirichlet(np.zeros(40, np.int64), np.zeros(4, np.int64), num_clients=20,
                        alpha=1e-3, seed=0, min_samples=2)


def test_partition_property():
  hypothesis = pytest.importorskip("hypothesis")
  st = hypothesis.strategies

  @hypothesis.settings(max_examples=60, deadline=None)
  @hypothesis.given(st.lists(st.integers(0, 5), min_size=1, max_size=60),
                    st.lists(st.integers(0, 5), max_size=30), st.integers(1, 8),
                    st.integers(0, 2**32 - 1))
  def check(y, y_test, num_clients, seed):
    y, y_test = np.array(y, np.int64), np.array(y_test, np.int64)
    num_clients = min(num_clients, len(y))
    in_train = np.isin(y_test, y)
    for name in partition.PARTITIONS:
      try:
        train, test = partition.partition(name, y, y_test, num_clients=num_clients, seed=seed,
                                          classes_per_client=1, dirichlet_alpha=1.0)
      except ValueError as e:  # Too few samples of a class, or of all, for the clients.
        assert "fewer clients" in str(e)
        continue
      for parts, n in ((train, len(y)), (test, len(y_test))):
        assert len(parts) == num_clients
        assert_disjoint(parts, n)
      if name == "classes":  # Every sample of a class some client holds.
        held = np.unique(y[np.concatenate(train)])
        assert sum(map(len, train)) == np.isin(y, held).sum()
        assert sum(map(len, test)) == np.isin(y_test, held).sum()
      if name == "dirichlet":  # Every train sample, and every test sample of a train class.
        assert sum(map(len, train)) == len(y) and sum(map(len, test)) == in_train.sum()
      if name == "iid":
        assert sum(map(len, train)) == len(y) and sum(map(len, test)) == len(y_test)

  check()


def test_digits_federated_classes():
  x, y, x_test, y_test = digits.load()
  assert x.shape[1:] == (8, 8, 1) and x.dtype == np.float32 and y.dtype == np.int32
  assert 0 <= x.min() and x.max() <= 1 and len(x) + len(x_test) == 1797
  assert np.abs(np.bincount(y_test) / len(y_test) - np.bincount(y) / len(y)).max() < 0.01
  data = digits.federated(50, "classes", 2)
  xs, ys, counts = np.asarray(data.x), np.asarray(data.y), np.asarray(data.counts)
  assert xs.shape == (50, data.samples, 8, 8, 1) and data.num_classes == 10
  assert counts.sum() == len(y)
  test_counts = np.asarray(data.test_counts)
  for i in range(50):
    assert not xs[i, counts[i]:].any() and not ys[i, counts[i]:].any()
    classes = set(ys[i, :counts[i]])
    assert 1 <= len(classes) <= 2
    assert set(np.asarray(data.y_test)[i, :test_counts[i]]) <= classes
  # FedRep's random rows: 32 distinct class sets at seed 0 (a cyclic window of 2 gave 5)
  sets = {frozenset(ys[i, :counts[i]].tolist()) for i in range(50)}
  assert len(sets) == 32


@pytest.mark.parametrize("size_sigma", [0.5, 1.0])
def test_classes_log_normal_sizes(size_sigma):
  rng = np.random.default_rng(0)
  y, y_test = rng.integers(0, 10, 100000), rng.integers(0, 10, 10000)
  clients = 1000  # 200 holders per class: a client's size is about its weight times a constant
  train, test = partition.classes(y, y_test, clients, S, seed=0, size_sigma=size_sigma)
  assert_disjoint(train, len(y))
  assert_disjoint(test, len(y_test))
  assert sum(map(len, train)) == len(y) and sum(map(len, test)) == len(y_test)
  held = [set(y[p]) for p in train]
  assert all(1 <= len(h) <= S for h in held)
  assert all(set(y_test[p]) <= h for p, h in zip(test, held))
  sizes = np.array([len(p) for p in train])
  test_sizes = np.array([len(p) for p in test])
  np.testing.assert_allclose(np.log(sizes).std(), size_sigma, rtol=0.15)
  # Test samples are split by the same weights, so test sizes follow train sizes.
  assert np.corrcoef(sizes, test_sizes)[0, 1] > 0.95
  again = partition.classes(y, y_test, clients, S, seed=0, size_sigma=size_sigma)
  assert all(np.array_equal(a, b) for a, b in zip(train + test, again[0] + again[1]))
  other, _ = partition.classes(y, y_test, clients, S, seed=1, size_sigma=size_sigma)
  assert not np.array_equal(sizes, [len(p) for p in other])


@pytest.mark.parametrize("size_sigma", [-0.5, float("nan"), float("inf")])
def test_classes_size_sigma_errors(size_sigma, labels):
  with pytest.raises(ValueError, match="size_sigma must be a finite number >= 0, got"):
    partition.partition("classes", *labels, num_clients=CLIENTS, seed=0, size_sigma=size_sigma)


def test_classes_size_sigma_property():
  hypothesis = pytest.importorskip("hypothesis")
  st = hypothesis.strategies

  @hypothesis.settings(max_examples=60, deadline=None)
  @hypothesis.given(st.lists(st.integers(0, 5), min_size=1, max_size=60),
                    st.lists(st.integers(0, 5), max_size=30), st.integers(1, 8),
                    st.integers(1, 3), st.floats(0.01, 3.0), st.integers(0, 2**32 - 1))
  def check(y, y_test, num_clients, classes_per_client, size_sigma, seed):
    y, y_test = np.array(y, np.int64), np.array(y_test, np.int64)
    num_clients = min(num_clients, len(y))
    classes_per_client = min(classes_per_client, len(np.unique(y)))
    try:
      train, test = partition.classes(y, y_test, num_clients, classes_per_client, seed,
                                      size_sigma=size_sigma)
    except ValueError as e:  # Too few samples of a class for its holders.
      assert "fewer clients" in str(e)
      return
    for parts, n in ((train, len(y)), (test, len(y_test))):
      assert len(parts) == num_clients
      assert_disjoint(parts, n)
    assert all(1 <= len(set(y[p])) <= classes_per_client for p in train)
    assert all(set(y_test[q]) <= set(y[p]) for p, q in zip(train, test))
    held = np.unique(y[np.concatenate(train)])
    assert sum(map(len, train)) == np.isin(y, held).sum()
    assert sum(map(len, test)) == np.isin(y_test, held).sum()

  check()
