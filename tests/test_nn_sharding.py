"""The neural round with its client axis sharded over devices (`Personalized.devices`).

Runs on 8 emulated CPU devices (XLA_FLAGS must be set before JAX starts, so they run in a
child process: this file run as a script) give the numbers of the unsharded run with the
same cohort groups: metrics, shared and personal params, full and partial participation,
one and several groups per device. Bad options fail with a ValueError before any compile.
"""

import dataclasses
import functools
import json
import os
import subprocess
import sys
import time

import chex
import jax
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.core import sharding
from fedjax_rep.data import flat
from fedjax_rep.nn.fedavg import FedAvg
from conftest import emulated_devices_env

HP = fr.nn_hparams(lr=0.1, momentum=0.5, weight_decay=1e-3)
MODEL = fr.make_model("digits-mlp", 10)
NUM_CLIENTS, GROUPS, ROUNDS, DEVICES = 16, 8, 3, 8
# run: (algorithm, cohort, devices of the sharded side); fedavg-ft tests the evaluation keys
# (with "flat": the clients in a flat store of unequal sizes, laid out for the devices)
RUNS = {"fedrep-full": ("fedrep", 16, 8), "fedrep-partial": ("fedrep", 8, 8),
        "fedrep-flat-partial": ("fedrep", 8, 8, "flat"),
        "fedavg-ft-flat-partial": ("fedavg-ft", 8, 4, "flat"),
        "fedavg-full": ("fedavg", 16, 8), "fedavg-ft-partial": ("fedavg-ft", 8, 4),
        "scaffold-partial": ("scaffold", 8, 8), "fedrod-partial": ("fedrod", 8, 8),
        "fedbabu-partial": ("fedbabu", 8, 4), "fed-mtl-partial": ("fed-mtl", 8, 8),
        "fedcp-partial": ("fedcp", 8, 4)}
CHILD_TIMEOUT = 300  # seconds for all the sharded runs


def small_data(num_clients=NUM_CLIENTS, layout="padded"):
  """The first `num_clients` of digits split over 40 clients (~34 samples each); "flat":
  in a flat store, client i keeping (1 + i % 3) / 3 of its training samples (unequal
  sizes, three size classes)."""
  data = jax.tree.map(lambda a: a[:num_clients], fr.digits.federated(40, "classes", 2, seed=0))
  if layout == "padded":
    return data
  counts = np.asarray(data.counts) * (1 + np.arange(num_clients) % 3) // 3
  return flat.from_padded(data.replace(counts=counts))


def algorithm(name, cohort, devices, cohort_groups=GROUPS):
  return fr.make_neural_algorithm(name, model=MODEL, cohort=cohort, local_epochs=1,
                                  head_epochs=2, ft_epochs=2, batch_size=4, client_group=2,
                                  cohort_groups=cohort_groups, devices=devices)


@functools.cache
def outcome(name, cohort, devices, layout="padded") -> dict:
  """{name: numpy array} of a ROUNDS-round run: train_loss [ROUNDS], the final
  evaluation's metrics, and the final shared and personal params (cached: the unsharded
  runs serve several tests)."""
  data = small_data(layout=layout)
  if devices is not None:
    if layout == "flat":
      data = flat.for_devices(data, devices)
    data = sharding.shard_clients(data, sharding.client_mesh(devices))
  result = fr.run(algorithm(name, cohort, devices), data, HP, jax.random.key(0), ROUNDS,
                  progress=False)
  state = jax.device_get(result.state)
  return {"train_loss": result.metrics["train_loss"], **result.eval_metrics,
          **{"shared/" + k: v for k, v in state.shared.items()},
          **{"personal/" + k: v for k, v in state.personal.items()}}


def errors() -> dict:
  """{case: the ValueError's message} of bad options that need several devices."""
  cases = {"clients_not_divisible_by_devices": (12, None),  # groups default: one per device
           "groups_not_multiple_of_devices": (NUM_CLIENTS, 4)}
  messages = {}
  for case, (num_clients, groups) in cases.items():
    try:
      algorithm("fedrep", 8, DEVICES, groups).init(jax.random.key(0), small_data(num_clients),
                                                   HP)
    except ValueError as error:
      messages[case] = str(error)
  return messages


class ShardedRuns:
  """The child process that computes `errors`, then in RUNS order the sharded side of every
  run, on DEVICES emulated devices (it starts at once, so it overlaps the unsharded runs
  here)."""

  def __init__(self, folder):
    self.folder = folder
    self.log = open(os.path.join(folder, "child.log"), "w")
    self.process = subprocess.Popen([sys.executable, __file__, folder, *RUNS],
                                    env=emulated_devices_env(DEVICES),
                                    stdout=self.log, stderr=subprocess.STDOUT)
    self.deadline = time.monotonic() + CHILD_TIMEOUT

  def result(self, run: str):
    """What the child wrote for `run` (a dict of arrays, or the errors' messages)."""
    path = os.path.join(self.folder, run + (".json" if run == "errors" else ".npz"))
    while not os.path.exists(path):
      if self.process.poll() is not None or time.monotonic() > self.deadline:
        self.close()
        with open(self.log.name) as log:
          raise RuntimeError(f"the sharded child gave no {run}:\n{log.read()[-4000:]}")
      time.sleep(0.2)
    if run == "errors":
      with open(path) as f:
        return json.load(f)
    with np.load(path) as npz:
      return dict(npz)

  def close(self):
    if self.process.poll() is None:
      self.process.kill()
    self.process.wait()
    self.log.close()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
  runs = ShardedRuns(str(tmp_path_factory.mktemp("sharded")))
  yield runs
  runs.close()


@pytest.mark.slow
@pytest.mark.parametrize("run", list(RUNS))
def test_sharded_rounds_equal_the_unsharded_ones(sharded, run):
  name, cohort, _, *layout = RUNS[run]
  expected = outcome(name, cohort, None, *layout)  # while the child computes
  chex.assert_trees_all_close(sharded.result(run), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_one_device_mesh_equals_unsharded():
  chex.assert_trees_all_close(outcome("fedrep", 8, 1), outcome("fedrep", 8, None), rtol=1e-5,
                              atol=1e-6)


@pytest.mark.slow
def test_options_that_need_several_devices_fail_clearly(sharded):
  messages = sharded.result("errors")
  assert "num_clients=12 must be a multiple of the number of devices (8)" in messages[
      "clients_not_divisible_by_devices"]
  assert "cohort_groups=4 must be a multiple of devices=8" in messages[
      "groups_not_multiple_of_devices"]


@pytest.mark.parametrize("options, message", [
    (dict(devices=len(jax.devices()) + 1), r"num_devices must be in \[1, "),
    (dict(devices=1, cohort_groups=3), r"num_clients=16 and cohort=8 must be multiples of the "
                                       r"cohort groups \(3\)"),
    (dict(devices=None, cohort_groups=3), r"multiples of the cohort groups \(3\)"),
    (dict(devices=0), r"devices must be an integer >= 1 or None, got 0"),
    (dict(devices=True), r"devices must be an integer >= 1 or None, got True"),
    (dict(devices=1, cohort_groups=2.0), r"cohort_groups must be an integer >= 1"),
])
def test_bad_options_fail_before_any_compile(options, message, compiles):
  alg = dataclasses.replace(algorithm("fedrep", 8, None), **options)
  data, key = small_data(), jax.random.key(0)
  compiles.reset()  # building the data and the key may compile; only the run must not
  with pytest.raises(ValueError, match=message):
    fr.run(alg, data, HP, key, 1, progress=False)
  assert compiles.count == 0


@pytest.mark.parametrize("name", ["flute", "l2gd"])
def test_algorithms_with_their_own_masked_round_refuse_devices(name, compiles):
  data, key = small_data(), jax.random.key(0)
  compiles.reset()  # building the data and the key may compile; only the run must not
  with pytest.raises(ValueError, match=f"{name} cannot run sharded .*masked_round"):
    fr.run(algorithm(name, 8, 1), data, HP, key, 1, progress=False)
  assert compiles.count == 0


class UnsummedFedAvg(FedAvg):
  """FedAvg whose server step sums the cohort without `cohort_sum`: sharded, the devices
  would disagree on the shared params."""

  def server_update(self, shared, sent, weights, hparams, info):
    return jax.tree.map(lambda u: jax.numpy.tensordot(weights, u, axes=1) / weights.sum(),
                        {k: sent[k] for k in shared}), info.server


def test_a_server_step_without_cohort_sum_refuses_devices():
  alg = algorithm("fedavg", 8, 1)
  alg = UnsummedFedAvg(**{f.name: getattr(alg, f.name) for f in dataclasses.fields(alg)})
  with pytest.raises(ValueError, match="cannot run sharded .*cohort_sum"):
    fr.run(alg, small_data(), HP, jax.random.key(0), 1, progress=False)


def test_masked_round_refuses_devices():
  alg = algorithm("fedrep", 8, 1)
  data = small_data()
  state = alg.init(jax.random.key(0), data, HP)
  with pytest.raises(ValueError, match="fedrep: masked_round trains given clients on one "
                                       "device; with devices=1 use round"):
    alg.masked_round(state, jax.random.key(1), data, HP, jax.numpy.arange(8))


if __name__ == "__main__":  # the child of ShardedRuns: folder, then the runs to compute
  folder = sys.argv[1]
  for run in ["errors", *sys.argv[2:]]:
    if run == "errors":
      path, result = os.path.join(folder, "errors.json"), errors()
      with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    else:
      path = os.path.join(folder, run + ".npz")
      with open(path + ".tmp", "wb") as f:
        np.savez(f, **outcome(*RUNS[run]))
    os.replace(path + ".tmp", path)  # whole files only: the parent polls for them
