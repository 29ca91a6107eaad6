"""docs/api.md's worked examples of a user's algorithm (FedAvg with server momentum,
FedRep with a step-size schedule, FedRep with the server's mean head) run as a user would,
and a user's mistakes are one-line errors before anything compiles."""

import csv
import dataclasses
import json
import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.core import registry
from fedjax_rep.experiments import plugins
from fedjax_rep.nn import algorithms as nn_algorithms
from test_docs import ROOT

MODEL = fr.make_model("digits-mlp", 10)
HP = fr.nn_hparams(lr=0.05)
KEY = jax.random.key(0)


def example_source() -> str:
  """The code of docs/api.md's block '# my_algorithms.py'."""
  text = (ROOT / "docs" / "api.md").read_text()
  return re.search(r"```python\n(# my_algorithms\.py\n.*?)```", text, re.S).group(1)


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
  """The path of docs/api.md's example, loaded as `--plugin` loads it (its algorithms
  registered while the tests of this module run)."""
  path = tmp_path_factory.mktemp("plugin") / "my_algorithms.py"
  path.write_text(example_source())
  plugins.load(str(path))
  yield path
  for name in ("fedavgm", "fedrep-decay", "fedrep-mean-head"):  # so that they load again
    registry.ALGORITHMS["neural"].pop(name)
    nn_algorithms.CLASSES.pop(name)


def data():
  return fr.digits.federated(20, "classes", 2, seed=0)


def make(name, **structure):
  return fr.make_neural_algorithm(name, model=MODEL, cohort=4, **structure)


def run(name, hparams, rounds=4):
  return fr.run(make(name), data(), hparams, KEY, rounds, eval_every=2, progress=False)


def test_server_momentum_zero_is_fedavg(examples):
  fedavg, momentum = run("fedavg", HP), run("fedavgm", fr.nn_hparams(lr=0.05, server_beta=0.0))
  np.testing.assert_allclose(momentum.metrics["train_loss"], fedavg.metrics["train_loss"],
                             rtol=1e-5)
  np.testing.assert_allclose(momentum.eval_metrics["test_accuracy"],
                             fedavg.eval_metrics["test_accuracy"], atol=1e-6)
  moved = run("fedavgm", fr.nn_hparams(lr=0.05, server_beta=0.9))
  assert not np.allclose(moved.metrics["train_loss"][1:], fedavg.metrics["train_loss"][1:])


def test_a_sweep_over_three_betas_compiles_the_round_once(examples, compiles):
  run("fedavgm", fr.nn_hparams(lr=0.05, server_beta=0.0))  # compiles (or finds) the round
  compiles.reset()
  for beta in (0.5, 0.9):
    run("fedavgm", fr.nn_hparams(lr=0.05, server_beta=beta))
  assert compiles.count == 0, compiles.names


@pytest.mark.slow  # the fast tier keeps the other two examples' runs
def test_a_schedule_over_rounds_sees_the_round_index(examples):
  fedrep = run("fedrep", HP)
  constant = run("fedrep-decay", fr.nn_hparams(lr=0.05, lr_decay=1.0))
  decayed = run("fedrep-decay", fr.nn_hparams(lr=0.05, lr_decay=0.5))
  np.testing.assert_array_equal(constant.metrics["train_loss"], fedrep.metrics["train_loss"])
  np.testing.assert_array_equal(decayed.metrics["train_loss"][0],
                                fedrep.metrics["train_loss"][0])  # round 0: lr * 0.5 ** 0
  assert not np.allclose(decayed.metrics["train_loss"][1:], fedrep.metrics["train_loss"][1:])


@pytest.mark.slow  # the fast tier keeps the example file's server momentum against FedAvg
def test_the_mean_head_is_the_cohorts_weighted_mean_and_mixing_none_is_fedrep(examples):
  fedrep = run("fedrep", HP)
  unmixed = run("fedrep-mean-head", fr.nn_hparams(lr=0.05, head_mix=0.0))
  np.testing.assert_allclose(unmixed.metrics["train_loss"], fedrep.metrics["train_loss"],
                             rtol=1e-5)
  np.testing.assert_allclose(unmixed.eval_metrics["test_accuracy"],
                             fedrep.eval_metrics["test_accuracy"], atol=1e-6)
  digits = data()  # one round of every client: the mean head is over all of them
  every = fr.make_neural_algorithm("fedrep-mean-head", model=MODEL, cohort=digits.num_clients)
  result = fr.run(every, digits, fr.nn_hparams(lr=0.05, head_mix=0.5), KEY, 1, progress=False)
  counts = np.asarray(digits.sample_counts(np.arange(digits.num_clients)), np.float64)
  for path, head in result.state.personal.items():
    expected = np.tensordot(counts, np.asarray(head, np.float64), axes=1) / counts.sum()
    np.testing.assert_allclose(result.state.server["mean_head"][path], expected, rtol=1e-5,
                               atol=1e-6)
  mixed = run("fedrep-mean-head", fr.nn_hparams(lr=0.05, head_mix=0.5))
  assert not np.allclose(mixed.metrics["train_loss"][1:], fedrep.metrics["train_loss"][1:])


@pytest.mark.slow
def test_the_mean_head_runs_beside_fedrep_in_fedrep_table1(examples, tmp_path):
  """docs/api.md's command: the plugin in fedrep-table1-cifar10 --quick, its option set."""
  out = tmp_path / "out"
  items = ["algorithms=fedrep,fedrep-mean-head", "head_mix=0.5", "num_clients=10",
           "classes_per_client=2", "rounds=2", "mock_examples=200"]
  assert cli.main(["run", "fedrep-table1-cifar10", "--quick", "--plugin", str(examples),
                   "--no-progress", *[a for item in items for a in ("--set", item)],
                   "--out", str(out)]) == 0
  with open(out / "table1.csv") as f:
    rows = list(csv.DictReader(f))
  assert [r["algorithm"] for r in rows] == ["fedrep", "fedrep-mean-head"]
  assert all(0 <= float(r["test_accuracy"]) <= 1 for r in rows)
  assert rows[1]["paper_test_accuracy"] == ""  # the paper has no such method
  assert json.loads((out / "config.json").read_text())["config"]["options"] == [["head_mix", 0.5]]


@dataclasses.dataclass(frozen=True)
class Typo(fr.Personalized):
  name: str = "typo"

  def labels(self, flat):
    return {p.replace("fc1", "fc_1"): "shared" for p in flat}


@dataclasses.dataclass(frozen=True)
class GrowingServer(fr.Personalized):
  name: str = "growing-server"

  def initial_server(self, shared, personal):
    return {"count": jnp.zeros(())}

  def server_update(self, shared, sent, weights, hparams, info):
    shared, server = super().server_update(shared, sent, weights, hparams, info)
    return shared, {**server, "extra": server["count"]}


@dataclasses.dataclass(frozen=True)
class Altered(fr.Personalized):
  """The default client_update with `alter` applied to its (sent, personal, loss)."""
  alter: Callable = lambda sent, personal, loss: (sent, personal, loss)

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    return self.alter(*super().client_update(shared, personal, x, y, count, key, hparams,
                                             info))


@dataclasses.dataclass(frozen=True)
class Raises(fr.Personalized):
  name: str = "raises"

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    return shared["body/nowhere"], personal, 0.0


@pytest.mark.parametrize("algorithm, hparams, message", [
    (Typo(model=MODEL, cohort=4), HP,
     r"typo: labels must return \{path: 'shared' or 'personal'\} for exactly the model's "
     r"params .*; got unknown paths \['body/fc_1/bias', 'body/fc_1/kernel'\]"),
    (GrowingServer(model=MODEL, cohort=4), HP,
     r"growing-server: server_update must return the server state with the structure and "
     r"shapes it got .*"),
    (Altered(model=MODEL, cohort=4, name="wrong-personal",
             alter=lambda s, p, loss: (s, jax.tree.map(lambda v: v[None], p), loss)), HP,
     r"wrong-personal: client_update must return the client's personal params shaped as it "
     r"got them and a scalar loss \[\]; got \['head/bias'\] of shape \(1, 10\)"),
    (Altered(model=MODEL, cohort=4, name="vector-loss",
             alter=lambda s, p, loss: (s, p, jnp.stack([loss, loss]))), HP,
     r"vector-loss: client_update must return .*; got a loss of shape \(2,\)"),
    (Raises(model=MODEL, cohort=4), HP,
     r"raises: client_update failed on the model's shapes: KeyError: 'body/nowhere'"),
    (make("fedrep"), HP.replace(options={"server_beta": jnp.float32(0.5)}),
     r"fedrep takes no option 'server_beta'; its options: average_untrained, dp_clip, "
     r"dp_noise, dp_poisson, ft_epochs, no_bias_decay, uniform_average"),
])
def test_a_mistake_in_a_users_algorithm_is_one_line_before_compiling(algorithm, hparams,
                                                                     message, compiles):
  digits = data()
  compiles.reset()
  with pytest.raises(ValueError, match=message) as error:
    fr.run(algorithm, digits, hparams, KEY, 1, progress=False)
  assert "\n" not in str(error.value)
  assert compiles.count == 0, compiles.names


def test_an_option_out_of_its_declared_range_is_one_line(examples, compiles):
  beyond = HP.replace(options={"server_beta": jnp.float32(-1.0)})
  digits = data()
  compiles.reset()
  with pytest.raises(ValueError, match=r"server_beta=1.5 is out of range: server_beta must "
                                       r"be in \[0, 0.99\] \(the server's momentum\)"):
    fr.nn_hparams(lr=0.05, server_beta=1.5)
  with pytest.raises(ValueError, match=r"server_beta=-1.0 is out of range") as error:
    fr.run(make("fedavgm"), digits, beyond, KEY, 1, progress=False)
  assert "\n" not in str(error.value)
  assert compiles.count == 0, compiles.names
