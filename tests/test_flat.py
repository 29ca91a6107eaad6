"""The flat client store (`data.flat`): size classes, the same training as padded data where
they agree, no recompiles across rounds, memory of the samples alone, clear errors.

The numpy references with unequal sizes in a flat store are in test_nn_reference.py
(FedRep, FedAvg, FedAvg-FT's evaluation) and test_flute_neural.py (FLUTE); sharded flat
stores in test_nn_sharding.py."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.data import flat
from fedjax_rep.data import synthetic
from fedjax_rep.data.federated import ClientDatasets, client_datasets, natural, stack
from test_nn_reference import HP, initial_state, make

COUNTS = [3, 20, 5, 17, 9, 30]  # size classes of 16 and 32 rows
TEST_COUNTS = [3, 4, 5, 3, 4, 5]


def data_pair(counts=COUNTS, seed=0):
  """(ClientDatasets padded to the largest client, FlatClients) of the same 6 clients of
  8x8x1 inputs."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(sum(counts) + sum(TEST_COUNTS), 8, 8, 1)).astype(np.float32)
  y = rng.integers(0, 10, len(x)).astype(np.int32)
  ends = np.cumsum(counts)
  parts = np.split(np.arange(ends[-1]), ends[:-1])
  test_parts = np.split(np.arange(ends[-1], len(x)), np.cumsum(TEST_COUNTS)[:-1])
  args = (x, y, parts, x, y, test_parts, 10)
  return client_datasets(*args), flat.flat_clients(*args)


@pytest.mark.parametrize("count, rows", [(0, 16), (1, 16), (16, 16), (17, 32), (300, 512),
                                         (1024, 1024)])
def test_class_rows(count, rows):
  assert flat.class_rows(count) == rows


@pytest.mark.parametrize("rows, group, expected, size", [
    (16, 10, 50, 10), (1024, 10, 50, 10), (2048, 10, 50, 5), (16384, 10, 50, 1),
    (256, 1, 50, 1), (64, 10, 3, 3), (64, 10, 0, 1)])
def test_group_size(rows, group, expected, size):
  assert flat.group_size(rows, group, expected) == size


def test_size_classes_hold_each_class_largest_test_split_and_share():
  classes = flat.size_classes(np.array([3, 40, 17, 60, 0]), np.array([1, 9, 2, 4, 7]))
  assert classes == ((16, 7, 0.4), (32, 2, 0.2), (64, 9, 0.4))


def test_store_holds_the_samples_alone():
  data = synthetic.federated(1.0, 1.0, 200, 0)
  padded = synthetic.federated(1.0, 1.0, 200, 0, layout="padded")
  samples = int(np.sum(data.counts) + np.sum(data.test_counts))
  assert data.x.shape == (samples, 60) and data.y.shape == (samples,)
  assert padded.x.size + padded.x_test.size > 10 * data.x.size  # heavy tails: padding dominates


@pytest.mark.slow  # the fast tier keeps test_nn_reference's flat stores against the reference
@pytest.mark.parametrize("name", ["fedrep", "fedavg-ft", "flute", "l2gd"])
def test_flat_rounds_and_evaluation_equal_the_padded_ones(name):
  """The flat store trains and tests every client as the padded layout does, up to float32
  round-off: a client's shuffles do not depend on its padding (threefry's draws of a
  longer array begin with those of a shorter), its groups are sorted by size and its
  outputs put back in cohort order."""
  padded, stored = data_pair()
  algorithm = make(name, **({"ft_epochs": 2} if name == "fedavg-ft" else {}))
  state = initial_state(algorithm, padded)
  step, evaluate = jax.jit(algorithm.masked_round), jax.jit(algorithm.evaluate)
  outcomes = []
  for data in (padded, stored):
    s, losses = state, []
    for t, clients in enumerate(([4, 1, 3, 0], [0, 4, 2, 5])):
      s, metrics = step(s, jax.random.key(t), data, HP, jnp.asarray(clients))
      losses.append(metrics["train_loss"])
    outcomes.append((s.shared, s.personal, losses, evaluate(s, data, HP)))
  chex.assert_trees_all_close(*outcomes, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # the fast tier keeps test_nn's no-recompile check of the padded layout
def test_no_recompiles_across_rounds_chunks_and_seeds(compiles):
  data = synthetic.federated(1.0, 1.0, 40, 0, test_fraction=0.2)  # classes 64 .. 2048
  assert len(data.classes) >= 4
  algorithm = fr.make_neural_algorithm("fedrep", model=fr.make_model("synthetic-mlp", 10),
                                       cohort=8, head_epochs=1, batch_size=10)
  first = fr.run(algorithm, data, HP, jax.random.key(0), 4, chunk=2, eval_every=2,
                 progress=False)
  assert compiles.count > 0
  compiles.reset()
  again = fr.run(algorithm, data, HP, jax.random.key(1), 5, chunk=2, eval_every=2,
                 progress=False)
  assert compiles.count == 0
  assert np.all(np.isfinite(first.metrics["train_loss"]))
  assert not np.allclose(first.metrics["train_loss"][:4], again.metrics["train_loss"][:4])


def test_stacked_runs_merge_classes_and_pad_stores():
  runs = [synthetic.federated(1.0, 1.0, 10, seed) for seed in (0, 1)]
  data = stack(runs)
  rows = max(d.x.shape[0] for d in runs)
  assert data.x.shape == (2, rows, 60) and data.counts.shape == (2, 10)
  merged = {r: (t, share) for r, t, share in data.classes}
  assert set(merged) == {r for d in runs for r, _, _ in d.classes}
  for d in runs:
    for r, t, share in d.classes:
      assert merged[r][0] >= t and merged[r][1] >= share
  np.testing.assert_array_equal(data.x[1, :runs[1].x.shape[0]], runs[1].x)
  with pytest.raises(ValueError, match=r"datasets\[1\] has clients 12 but datasets\[0\] has 10"):
    stack([runs[0], synthetic.federated(1.0, 1.0, 12, 0)])


def test_for_devices_puts_each_devices_clients_in_its_block():
  data = synthetic.federated(1.0, 1.0, 8, 0)
  laid = flat.for_devices(data, 4)
  block = laid.x.shape[0] // 4
  assert laid.blocks == 4 and laid.x.shape[0] == 4 * block
  for i in range(8):
    start = (i // 2) * block + int(laid.offsets[i])
    np.testing.assert_array_equal(laid.x[start:start + int(laid.counts[i])],
                                  data.x[int(data.offsets[i]):][:int(data.counts[i])])
    start = (i // 2) * block + int(laid.test_offsets[i])
    np.testing.assert_array_equal(laid.y[start:start + int(laid.test_counts[i])],
                                  data.y[int(data.test_offsets[i]):][:int(data.test_counts[i])])
  with pytest.raises(ValueError, match="devices=3 must divide num_clients=8"):
    flat.for_devices(data, 3)


def test_a_store_laid_out_for_devices_refuses_one_device(compiles):
  data = flat.for_devices(synthetic.federated(1.0, 1.0, 8, 0), 2)
  algorithm, key = make("fedrep"), jax.random.key(0)
  compiles.reset()  # building the data and the key may compile; only the run must not
  with pytest.raises(ValueError, match="laid out for 2 devices .* runs on one"):
    fr.run(algorithm, data, HP, key, 1, progress=False)
  assert compiles.count == 0


@pytest.mark.parametrize("change, message", [
    (dict(offsets=np.array([0, 5, 10, 100])), r"client 3's rows \(offsets\[3\] = 100"),
    (dict(test_counts=np.array([1, 1, 1, -1])), r"client 3's test_rows .*test_counts\[3\] = -1"),
    (dict(counts=np.zeros(4, np.int32)), "counts are all 0"),
    (dict(y=np.full(30, 12)), r"y\[0\] = 12 .* not a class in \[0, 10\)"),
])
def test_bad_stores_fail_clearly(change, message):
  args = dict(x=np.zeros((30, 3), np.float32), y=np.zeros(30, np.int32),
              offsets=np.array([0, 5, 10, 15]), counts=np.array([5, 5, 5, 5]),
              test_offsets=np.array([20, 22, 24, 26]), test_counts=np.array([2, 2, 2, 2]))
  args.update(change)
  with pytest.raises(ValueError, match=message):
    flat.segments(**args, num_classes=10)


def test_natural_pads_only_clients_of_one_size():
  padded, stored = data_pair()
  x, y = np.zeros((40, 3), np.float32), np.zeros(40, np.int32)
  parts = [np.arange(10), np.arange(10, 20)]
  equal = natural(x, y, parts, x, y, [np.arange(20, 22), np.arange(22, 25)], 10)
  assert isinstance(equal, ClientDatasets) and equal.x.shape == (2, 10, 3)
  unequal = natural(x, y, [np.arange(10), np.arange(10, 30)], x, y, parts, 10)
  assert isinstance(unequal, flat.FlatClients) and unequal.x.shape == (50, 3)


def test_from_padded_keeps_every_clients_samples():
  padded, stored = data_pair()
  again = flat.from_padded(padded)
  for field in ("x", "y", "offsets", "counts", "test_offsets", "test_counts"):
    np.testing.assert_array_equal(getattr(again, field), getattr(stored, field))
