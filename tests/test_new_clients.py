"""Clients held out of training (`data.new_clients`, `nn.new_clients`): chosen by the seed,
never touching training, adapted as each method's rule says (against the numpy reference in
test_nn_reference.py), in every neural recipe through `--set new_clients`."""

import csv
import json

import jax
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.data import flat
from fedjax_rep.data import new_clients
from fedjax_rep.nn import program as nn_program
from fedjax_rep.nn.new_clients import NewClients, WithNewClients

HP = fr.nn_hparams(lr=0.1, momentum=0.5, weight_decay=1e-3)
MODEL = fr.make_model("digits-mlp", 10)
NAMES = ("fedrep", "lg-fedavg", "fedavg-ft", "local")


def digits(num_clients=12, seed=0):
  return fr.digits.federated(num_clients, "classes", 2, seed=seed)


def make(name, cohort=3):
  return fr.make_neural_algorithm(name, model=MODEL, cohort=cohort, local_epochs=1,
                                  head_epochs=2, ft_epochs=2, batch_size=8, client_group=3)


@pytest.mark.parametrize("value, n, k", [(0.2, 50, 10), (0.25, 10, 2), (0.0, 10, 0),
                                         (3, 50, 3), (3.0, 50, 3), (0.94, 10, 9)])
def test_a_fraction_or_a_whole_number_of_clients(value, n, k):
  assert new_clients.count(value, n) == k


@pytest.mark.parametrize("value, message", [
    (1.5, r"new_clients=1.5 must be a fraction in \[0, 1\) or a whole number"),
    (10, r"holds out 10 of the 10 clients, leaving none to train"),
    (0.999, r"holds out 10 of the 10 clients")])
def test_holding_out_every_client_or_part_of_one_is_refused(value, message):
  with pytest.raises(ValueError, match=message):
    new_clients.count(value, 10)


@pytest.mark.parametrize("layout", ["padded", "flat"])
def test_the_seed_chooses_them_and_each_part_holds_only_its_own_samples(layout):
  data = digits()
  if layout == "flat":
    data = flat.from_padded(data)
  train, new = new_clients.split(data, 3, seed=7)
  chosen = new_clients.chosen(7, 12, 3)
  np.testing.assert_array_equal(chosen, np.unique(chosen))  # ascending, distinct
  assert not np.array_equal(chosen, new_clients.chosen(8, 12, 3))
  others = np.setdiff1d(np.arange(12), chosen)
  assert (train.num_clients, new.num_clients) == (9, 3) and type(train) is type(data)
  np.testing.assert_array_equal(train.counts, np.asarray(data.counts)[others])
  np.testing.assert_array_equal(new.counts, np.asarray(data.counts)[chosen])
  np.testing.assert_array_equal(new.test_counts, np.asarray(data.test_counts)[chosen])
  if layout == "flat":  # the training store holds none of the new clients' rows
    assert train.x.shape[0] == int(np.sum(train.counts) + np.sum(train.test_counts))
    rows = lambda d, c: np.asarray(d.x)[int(d.offsets[c]):int(d.offsets[c] + d.counts[c])]
    np.testing.assert_array_equal(rows(new, 0), rows(data, chosen[0]))
  else:
    np.testing.assert_array_equal(new.x, np.asarray(data.x)[chosen])


@pytest.mark.parametrize("name", ["fedrep", pytest.param("lg-fedavg", marks=pytest.mark.slow)])
def test_new_clients_never_touch_training(name):
  """Garbage for the new clients' training labels: the training metrics, the trained
  shared params and the training clients' evaluation are bit-identical; only the new
  clients' accuracy moves."""
  train, new = new_clients.split(digits(), 3, seed=0)
  rng = np.random.default_rng(0)
  garbage = new.replace(y=rng.integers(0, 10, new.y.shape).astype(new.y.dtype))
  algorithm = NewClients(make(name), epochs=3)
  runs = [fr.run(algorithm, WithNewClients(train=train, new=held), HP, jax.random.key(0), 4,
                 chunk=2, eval_every=2, progress=False) for held in (new, garbage)]
  np.testing.assert_array_equal(runs[0].metrics["train_loss"], runs[1].metrics["train_loss"])
  for path, leaf in runs[0].state.shared.items():
    np.testing.assert_array_equal(runs[1].state.shared[path], leaf)
  for metric, values in runs[0].eval_metrics.items():
    if metric.startswith("test_"):
      np.testing.assert_array_equal(runs[1].eval_metrics[metric], values)
  assert not np.array_equal(runs[0].eval_metrics["new_accuracy"],
                            runs[1].eval_metrics["new_accuracy"])


def test_the_family_program_adapts_each_members_new_clients_as_its_own():
  """FedRep, LG-FedAvg, FedAvg-FT and local only in their one traced program: each
  member's new clients (its own rule, selected inside the program) as its own algorithm's."""
  train, new = new_clients.split(digits(), 3, seed=0)
  state_of = lambda algorithm, hparams: algorithm.init(jax.random.key(0), train, hparams)
  peers = [make(n) for n in NAMES]
  key = jax.random.key(4)
  for own in peers:
    program, hparams = nn_program.program(own, HP, peers, train.x[0, 0])
    assert program != own
    got = jax.jit(program.new_clients, static_argnums=4)(state_of(program, hparams), new,
                                                         hparams, key, 3)
    want = jax.jit(own.new_clients, static_argnums=4)(state_of(own, HP), new, HP, key, 3)
    for metric, value in want.items():
      np.testing.assert_allclose(got[metric], value, atol=1e-6, err_msg=f"{own.name} {metric}")


@pytest.mark.slow  # the fast tier keeps the held-out clients' program (tests above)
def test_a_recipe_tests_new_clients_and_reports_the_participation_gap(tmp_path):
  out = tmp_path / "run"
  overrides = ["new_clients=0.25", "num_clients=20", "rounds=4", "eval_every=2",
               "algorithms=fedrep,fedavg", "participation=0.4", "eval_clients=cohort"]
  assert cli.main(["run", "digits-personalized", "--quick", "--no-progress", "--seeds", "2",
                   "--out", str(out), *[a for o in overrides for a in ("--set", o)]]) == 0
  with open(out / "metrics.csv") as f:
    rows = [r for r in csv.DictReader(f) if r["new_accuracy"]]
  assert {r["new_client_count"] for r in rows} == {"5"}
  assert {r["test_clients"] for r in rows} == {"6"}  # the last cohort: 0.4 of the 15 that train
  with open(out / "summary.csv") as f:
    summary = list(csv.DictReader(f))
  for entry in summary:
    assert float(entry["participation_gap"]) == pytest.approx(
        float(entry["test_accuracy"]) - float(entry["new_accuracy"]))
  config = json.loads((out / "config.json").read_text())["config"]
  assert (config["new_clients"], config["new_epochs"]) == (0.25, 10)


def test_holding_out_every_client_is_one_line_before_any_work(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(["run", "digits-personalized", "--quick", "--no-progress", "--out", str(out),
                   "--set", "new_clients=50"]) != 0
  lines = capsys.readouterr().err.splitlines()
  assert len(lines) == 1 and "holds out 50 of the 50 clients" in lines[0], lines
  assert not (out / "metrics.csv").exists()


@pytest.mark.slow  # the fast tier keeps FedRep, LG-FedAvg, FedAvg-FT and local only (above)
def test_every_registered_algorithm_tests_its_new_clients():
  train, new = new_clients.split(digits(), 3, seed=0)
  for name in fr.ALGORITHMS["neural"]:
    algorithm = make(name)
    state = algorithm.init(jax.random.key(0), train, HP)
    metrics = jax.jit(algorithm.new_clients, static_argnums=4)(state, new, HP,
                                                               jax.random.key(1), 2)
    assert 0 <= float(metrics["test_accuracy"]) <= 1, name
    assert int(metrics["test_clients"]) == 3, name
