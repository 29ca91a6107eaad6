"""The per-client validation split (`fr.validation_split`, `data.validation`): which rows go
where against a numpy statement of the rule, for both stores (one run, stacked runs, laid
out for devices); the val_* metrics against a per-client numpy recomputation (jit, a
vmapped sweep of seeds, the last cohort, sharded); fraction 0 changing nothing; one-line
errors."""

import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.data import flat
from fedjax_rep.data.federated import ClientDatasets
from fedjax_rep.nn import params as params_lib

import nn_reference

# The clients of `raw` without training samples: a warning of the data's check, meant here.
pytestmark = pytest.mark.filterwarnings("ignore:1 of 8 clients have no training samples")

COUNTS = [1, 2, 3, 5, 8, 13, 0, 21]  # client 6 has no training sample
TEST_COUNTS = [2, 1, 3, 2, 1, 3, 2, 1]
HP = fr.nn_hparams(lr=0.1, momentum=0.5)
MODEL = fr.make_model("digits-mlp", 10)


# -- which rows go where ---------------------------------------------------------------------
def raw(seed):
  """(x [N, 3], y [N], parts, test_parts) of 8 clients of COUNTS training rows (rolled by
  the seed) and TEST_COUNTS test rows, at random rows of the dataset; row r's x is (r, r +
  0.5, seed), so a row is known by its values."""
  counts = np.roll(COUNTS, seed)
  total = sum(COUNTS) + sum(TEST_COUNTS)
  rng = np.random.default_rng(seed)
  x = np.stack([np.arange(total), np.arange(total) + 0.5, np.full(total, seed)], 1)
  y = rng.integers(0, 10, total).astype(np.int32)
  rows = rng.permutation(total)
  parts = np.split(rows[:sum(counts)], np.cumsum(counts)[:-1])
  test_parts = np.split(rows[sum(counts):], np.cumsum(TEST_COUNTS)[:-1])
  return x.astype(np.float32), y, parts, test_parts


def reference(parts, fraction, seed):
  """(training rows, validation rows) of each client: the rule stated plainly. Client i of
  c rows gives k = min(floor(fraction c), c - 1) rows, the positions that
  default_rng((seed, i)) chooses, in their order; the rest stay in theirs."""
  train, val = [], []
  for i, part in enumerate(parts):
    c = len(part)
    k = max(0, min(math.floor(fraction * c), c - 1))
    chosen = np.random.default_rng((seed, i)).choice(c, k, replace=False) if k else []
    moved = np.isin(np.arange(c), chosen)
    train.append(part[~moved])
    val.append(part[moved])
  return train, val


def store(layout, seed):
  """One run's data of `raw(seed)`: "padded" ClientDatasets, "flat" FlatClients, "blocks"
  FlatClients laid out for 2 devices."""
  x, y, parts, test_parts = raw(seed)
  if layout == "padded":
    return fr.client_datasets(x, y, parts, x, y, test_parts, 10)
  with pytest.warns(UserWarning, match="no training samples"):
    data = fr.flat_clients(x, y, parts, x, y, test_parts, 10)
  return flat.for_devices(data, 2) if layout == "blocks" else data


def client_rows(data):
  """[(x, y) per client] of the training, test and validation rows of one run's store;
  padded stores' padding checked to be zero."""
  if isinstance(data, ClientDatasets):
    def take(x, y, counts):
      x, y, counts = np.asarray(x), np.asarray(y), np.asarray(counts)
      for i, c in enumerate(counts):
        assert not x[i, c:].any() and not y[i, c:].any()
      return [(x[i, :c], y[i, :c]) for i, c in enumerate(counts)]

    return (take(data.x, data.y, data.counts), take(data.x_test, data.y_test,
                                                    data.test_counts),
            take(data.x_val, data.y_val, data.val_counts) if data.has_validation else None)
  block, held = data.x.shape[0] // data.blocks, data.num_clients // data.blocks
  x, y = np.asarray(data.x), np.asarray(data.y)

  def take(offsets, counts):
    starts = np.arange(data.num_clients) // held * block + np.asarray(offsets)
    return [(x[s:s + c], y[s:s + c]) for s, c in zip(starts, np.asarray(counts))]

  return (take(data.offsets, data.counts), take(data.test_offsets, data.test_counts),
          take(data.val_offsets, data.val_counts) if data.has_validation else None)


def run_of(data, r):
  return jax.tree.map(lambda a: a[r], data)


@pytest.mark.parametrize("fraction", [0.3, 0.9])
@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("layout", ["padded", "flat", "blocks"])
def test_split_moves_the_rows_the_rule_names(layout, stacked, fraction):
  seeds = [0, 1] if stacked else [0]
  runs = [store(layout, s) for s in seeds]
  data = fr.stack_datasets(runs) if stacked else runs[0]
  split_seeds = [11, 12] if stacked else 11
  got = fr.validation_split(data, fraction, split_seeds)
  assert type(got) is type(data) and got.has_validation
  for r, seed in enumerate(seeds):
    one = run_of(got, r) if stacked else got
    x, y, parts, test_parts = raw(seed)
    train, val = reference(parts, fraction, [11, 12][r] if stacked else 11)
    got_train, got_test, got_val = client_rows(one)
    for i in range(8):
      for (gx, gy), rows in ((got_train[i], train[i]), (got_val[i], val[i]),
                             (got_test[i], test_parts[i])):
        np.testing.assert_array_equal(gx, x[rows])
        np.testing.assert_array_equal(gy, y[rows])
    counts, val_counts = np.asarray(one.counts), np.asarray(one.val_counts)
    np.testing.assert_array_equal(counts, [len(t) for t in train])
    np.testing.assert_array_equal(val_counts, [len(v) for v in val])
    original = np.array([len(p) for p in parts])
    assert np.all((counts >= 1) | (original == 0))  # a client keeps a training sample
    assert np.all(val_counts[original <= 1] == 0)  # k = 0: no validation sample
    assert (val_counts == 0).sum() >= 2 and (val_counts > 0).any()
  if layout != "padded":  # the size classes are those of the reduced counts
    for r in range(len(seeds)):
      one = run_of(got, r) if stacked else got
      classes = flat.size_classes(np.asarray(one.counts), np.asarray(one.test_counts))
      held = {rows: (t, share) for rows, t, share in got.classes}
      val_held = dict(got.val_classes)
      assert all(held[rows][0] >= t and held[rows][1] >= share for rows, t, share in classes)
      for rows, v in flat.validation_classes(np.asarray(one.counts),
                                             np.asarray(one.val_counts)):
        assert val_held[rows] >= v
  with pytest.warns(UserWarning, match="no validation samples"):
    for r in range(len(seeds)):
      (run_of(got, r) if stacked else got).check()


@pytest.mark.filterwarnings("ignore:2 of 8 clients have no validation samples")
def test_stores_carry_the_split_through_from_padded_for_devices_and_stack():
  x, y, parts, test_parts = raw(0)
  padded = fr.validation_split(store("padded", 0), 0.5, 3)
  stored = flat.from_padded(padded)
  laid = flat.for_devices(stored, 4)
  for data in (stored, laid):
    for ours, theirs in zip(client_rows(data), client_rows(padded)):
      for (ox, oy), (tx, ty) in zip(ours, theirs):
        np.testing.assert_array_equal(ox, tx)
        np.testing.assert_array_equal(oy, ty)
  assert stored.val_classes == flat.validation_classes(np.asarray(stored.counts),
                                                       np.asarray(stored.val_counts))
  view = padded.validation_view()
  assert not view.has_validation
  np.testing.assert_array_equal(view.test_counts, padded.val_counts)
  np.testing.assert_array_equal(view.x_test, padded.x_val)
  flat_view = laid.validation_view()
  np.testing.assert_array_equal(flat_view.test_offsets, laid.val_offsets)
  assert [t for _, t, _ in flat_view.classes] == [v for _, v in laid.val_classes]
  both = fr.stack_datasets([padded, fr.validation_split(store("padded", 1), 0.5, 4)])
  assert both.x_val.shape[:2] == (2, 8) and both.val_counts.shape == (2, 8)
  for r, single in enumerate((padded, fr.validation_split(store("padded", 1), 0.5, 4))):
    np.testing.assert_array_equal(both.val_counts[r], single.val_counts)


# -- the val_* metrics -----------------------------------------------------------------------
def digits(seed, layout):
  """The first 8 digits clients (of 40), client i keeping (1 + i % 3) / 3 of its training
  samples and client 0 one (so it gives no validation sample): padded or in a flat store."""
  data = jax.tree.map(lambda a: a[:8], fr.digits.federated(40, "classes", 2, seed=seed))
  counts = np.asarray(data.counts) * (1 + np.arange(8) % 3) // 3
  counts[0] = 1
  data = data.replace(counts=counts.astype(np.int32))
  return flat.from_padded(data) if layout == "flat" else data


def val_reference(state, data) -> dict:
  """The val_* metrics of one run: each client with validation samples (and in the last
  cohort, where the state keeps one) tested, in float64 numpy, with FedRep's params (the
  shared body and its own head) on its validation rows."""
  accuracies, hits, counts = [], [], []
  for i, (x, y) in enumerate(client_rows(data)[2]):
    if not len(y) or (state.cohort is not None and not state.cohort[i]):
      continue
    params = {k: np.asarray(v, np.float64) for k, v in params_lib.merge(
        state.shared, jax.tree.map(lambda p: p[i], state.personal)).items()}
    logits, _ = nn_reference.forward(params, x)
    hits.append(int(np.sum(np.argmax(logits, 1) == y)))
    counts.append(len(y))
    accuracies.append(hits[-1] / len(y))
  return {"val_accuracy": np.mean(accuracies),
          "val_accuracy_weighted": sum(hits) / sum(counts),
          "val_accuracy_std": np.std(accuracies),
          "val_accuracy_p10": np.percentile(accuracies, 10), "val_clients": len(accuracies)}


VAL_METRICS = {"val_accuracy", "val_accuracy_weighted", "val_accuracy_std", "val_accuracy_p10",
               "val_clients"}


def check_val_metrics(metrics: dict, expected: dict):
  assert int(metrics["val_clients"]) == expected["val_clients"]
  for name, value in expected.items():
    np.testing.assert_allclose(metrics[name], value, rtol=2e-6, atol=1e-7, err_msg=name)


def algorithm(**structure):
  structure = {"cohort": 4, "local_epochs": 1, "head_epochs": 1, "batch_size": 8,
               "client_group": 2, **structure}
  return fr.make_neural_algorithm("fedrep", model=MODEL, **structure)


@pytest.mark.parametrize("layout, eval_clients", [  # the fast tier keeps the padded layout's
    ("padded", "all"), pytest.param("flat", "all", marks=pytest.mark.slow),
    pytest.param("padded", "cohort", marks=pytest.mark.slow)])
def test_val_metrics_are_each_clients_accuracy_on_its_validation_rows(layout, eval_clients):
  fedrep = algorithm(eval_clients=eval_clients)
  data = fr.validation_split(digits(0, layout), 0.25, 5)
  with pytest.warns(UserWarning, match=r"1 of 8 clients have no validation samples \(client 0"):
    result = fr.run(fedrep, data, HP, jax.random.key(0), 2, progress=False)
  state = jax.device_get(result.state)
  expected = val_reference(state, data)
  assert expected["val_clients"] == (7 if eval_clients == "all"
                                     else int(np.sum(state.cohort[1:])))
  check_val_metrics({k: v[-1] for k, v in result.eval_metrics.items()}, expected)
  assert {k for k in result.eval_metrics if k.startswith("val_")} == VAL_METRICS


@pytest.mark.slow  # the fast tier keeps each client's validation accuracy of one run
@pytest.mark.parametrize("layout", ["padded", "flat"])
def test_val_metrics_of_a_vmapped_sweep_of_seeds(layout):
  data = fr.validation_split(fr.stack_datasets([digits(s, layout) for s in (0, 1)]), 0.25,
                             [5, 6])
  keys = jnp.stack([jax.random.key(10), jax.random.key(11)])
  with pytest.warns(UserWarning, match="no validation samples"):
    result = fr.run(algorithm(), data, HP, keys, 2, sweep_axes=(0, None, 0), progress=False)
  state = jax.device_get(result.state)
  for r in (0, 1):
    check_val_metrics({k: v[r, -1] for k, v in result.eval_metrics.items()},
                      val_reference(run_of(state, r), run_of(data, r)))


# -- fraction 0 ------------------------------------------------------------------------------
def test_fraction_zero_is_the_data_itself_and_adds_no_metric():
  data = digits(0, "padded")
  stacked = fr.stack_datasets([digits(s, "flat") for s in (0, 1)])
  assert fr.validation_split(data, 0, 7) is data
  assert fr.validation_split(data, 0.0, 7) is data
  assert fr.validation_split(stacked, 0.0, [7, 8]) is stacked
  fedrep = algorithm()
  before = fr.run(fedrep, data, HP, jax.random.key(0), 2, progress=False)
  after = fr.run(fedrep, fr.validation_split(data, 0.0, 7), HP, jax.random.key(0), 2,
                 progress=False)
  assert list(after.eval_metrics) == list(before.eval_metrics)
  assert not any(k.startswith("val_") for k in after.eval_metrics)
  for name, value in before.eval_metrics.items():
    np.testing.assert_array_equal(after.eval_metrics[name], value, err_msg=name)


@pytest.mark.slow  # the fast tier keeps each client's validation accuracy of one run
def test_a_split_leaves_the_test_metrics_of_a_state_bit_identical():
  """The same state evaluated on split data and on the same data without their validation
  fields: the test_* metrics agree bit for bit (testing on validation rows as well changes
  nothing of the test split's numbers)."""
  fedrep = algorithm()
  data = fr.validation_split(digits(0, "flat"), 0.25, 5)
  with pytest.warns(UserWarning, match="no validation samples"):
    state = fr.run(fedrep, data, HP, jax.random.key(0), 2, progress=False).state
  both = fr.evaluate(fedrep, state, data, HP)
  alone = fr.evaluate(fedrep, state, data.replace(val_offsets=None, val_counts=None,
                                                  val_classes=None), HP)
  assert set(both) - set(alone) == VAL_METRICS
  for name, value in alone.items():
    np.testing.assert_array_equal(both[name], value, err_msg=name)


# -- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fraction, seeds, stacked, message", [
    (-0.1, 0, False, r"fraction must be a number in \[0, 1\).*got -0.1"),
    (1.0, 0, False, r"fraction must be a number in \[0, 1\).*got 1.0"),
    (float("nan"), 0, False, r"fraction must be a number in \[0, 1\).*got nan"),
    (True, 0, False, r"fraction must be a number in \[0, 1\).*got True"),
    ("0.1", 0, False, r"fraction must be a number in \[0, 1\).*got '0.1'"),
    (0.2, -1, False, r"seeds must be an int >= 0 for one run's data.*got -1"),
    (0.2, [0], False, r"seeds must be an int >= 0 for one run's data.*got \[0\]"),
    (0.2, 1.5, False, r"seeds must be an int >= 0.*got 1.5"),
    (0.2, 0, True, r"seeds must be 2 ints >= 0, one per run of the stacked data.*got 0"),
    (0.2, [0, 1, 2], True, r"seeds must be 2 ints >= 0, one per run.*got \[0, 1, 2\]"),
    (0.0, [0, -1], True, r"seeds must be 2 ints >= 0.*got \[0, -1\]"),
])
def test_bad_fractions_and_seeds_are_one_line_errors(fraction, seeds, stacked, message):
  data = store("padded", 0)
  if stacked:
    data = fr.stack_datasets([data, store("padded", 1)])
  with pytest.raises(ValueError, match="^validation_split: " + message) as error:
    fr.validation_split(data, fraction, seeds)
  assert "\n" not in str(error.value)


def test_bad_data_are_one_line_errors():
  padded = store("padded", 0)
  split = fr.validation_split(padded, 0.5, 0)
  bad_labels = padded.replace(y=np.where(np.arange(padded.y.shape[1]) == 0, 12, padded.y))
  cases = [
      (lambda: fr.validation_split(np.zeros(3), 0.5, 0), "data must be ClientDatasets or "
       "FlatClients, got a ndarray"),
      (lambda: fr.validation_split(split, 0.5, 0), "already have a validation split"),
      (lambda: fr.validation_split(bad_labels, 0.5, 0), r"y\[0, 0\] = 12"),
      (lambda: padded.validation_view(), "no validation split: make one with "
       r"fr.validation_split\(data, fraction, seeds\)"),
      (lambda: store("flat", 0).validation_view(), "no validation split"),
      (lambda: padded.map_clients(None, None, jnp.arange(2), None, validation=True),
       "validation=True but these data have no validation split"),
      (lambda: split.replace(val_counts=None).check_layout(), "has x_val, y_val but not all"),
      (lambda: split.replace(y_val=split.y_val[:, :1]).check_layout(),
       r"y_val has shape \(8, 1\)"),
      (lambda: fr.stack_datasets([split, store("padded", 1)]),
       r"datasets\[1\] has no validation split but datasets\[0\] has a validation split"),
      (lambda: fr.stack_datasets([fr.validation_split(store("flat", 0), 0.5, 0),
                                  store("flat", 1)]),
       r"datasets\[1\] has validation split False but datasets\[0\] has True"),
      (lambda: jax.jit(lambda d: fr.validation_split(d, 0.5, 0))(padded), "are traced"),
  ]
  stored = fr.validation_split(store("flat", 0), 0.5, 0)
  cases += [
      (lambda: stored.replace(val_classes=None).check_layout(), "has val_offsets, val_counts "
       "but not all"),
      (lambda: stored.replace(val_classes=stored.val_classes[1:]).check_layout(),
       r"val_classes .* miss the size classes \[16\]"),
      (lambda: stored.replace(val_offsets=stored.val_offsets + 1000).check(),
       r"client 0's val_rows \(val_offsets\[0\] = \d+, val_counts\[0\] = 0\) are not within"),
      (lambda: stored.replace(val_classes=tuple((r, 0) for r, _ in stored.val_classes)).check(),
       "val_classes .* do not hold the validation rows"),
  ]
  for case, message in cases:
    with pytest.raises(ValueError, match=message) as error:
      case()
    assert "\n" not in str(error.value), message


# -- sharded ---------------------------------------------------------------------------------
DEVICES = 2


def sharded_metrics(layout: str, devices) -> dict:
  """The final evaluation of 2 FedRep rounds on `digits` split (0.25, seed 5), on
  `devices` devices (None: unsharded) with 2 cohort groups."""
  from fedjax_rep.core import sharding
  data = fr.validation_split(digits(0, layout), 0.25, 5)
  if devices is not None:
    if layout == "flat":
      data = flat.for_devices(data, devices)
    data = sharding.shard_clients(data, sharding.client_mesh(devices))
  result = fr.run(algorithm(cohort_groups=2, devices=devices), data, HP, jax.random.key(0), 2,
                  progress=False)
  return {k: np.asarray(v[-1]) for k, v in result.eval_metrics.items()}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:1 of 8 clients have no validation samples")
def test_sharded_val_metrics_equal_the_unsharded_ones(tmp_path):
  import subprocess
  from conftest import emulated_devices_env
  child = subprocess.Popen([sys.executable, __file__, str(tmp_path)],
                           env=emulated_devices_env(DEVICES), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
  unsharded = {layout: sharded_metrics(layout, None) for layout in ("padded", "flat")}
  log = child.communicate(timeout=300)[0].decode()
  assert child.returncode == 0, log[-4000:]
  for layout, expected in unsharded.items():
    with np.load(os.path.join(tmp_path, layout + ".npz")) as got:
      assert sorted(got) == sorted(expected)
      for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, err_msg=name)


if __name__ == "__main__":  # the sharded side, on DEVICES emulated devices
  import warnings
  warnings.simplefilter("ignore")
  assert jax.device_count() == DEVICES, jax.devices()
  for layout in ("padded", "flat"):
    np.savez(os.path.join(sys.argv[1], layout + ".npz"), **sharded_metrics(layout, DEVICES))
