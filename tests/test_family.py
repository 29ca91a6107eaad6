"""`nn.partial`, `nn.program`: one (traced) program runs FedRep, FedRep*, FedPer, LG-FedAvg,
FedAvg, FedAvg-FT and local only with each one's own numbers, and compiles once for all of
them; FedProx and SCAFFOLD share one with their "+ FT" variants, FLUTE with FLUTE*."""

import jax
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.nn import partial
from fedjax_rep.nn import program as nn_program
from fedjax_rep.nn import train

HP = fr.nn_hparams(lr=0.1, momentum=0.5, weight_decay=1e-3)
MODEL = fr.make_model("digits-mlp", 10)
NAMES = ("fedrep", "fedrep-star", "fedper", "lg-fedavg", "fedavg", "fedavg-ft", "local")


def small_data(num_clients=6, seed=0):
  """The first `num_clients` of digits split over 40 clients (~34 samples each)."""
  data = fr.digits.federated(40, "classes", 2, seed=seed)
  return jax.tree.map(lambda a: a[:num_clients], data)


def make(name, **structure):
  structure = {"local_epochs": 2, "head_epochs": 3, "ft_epochs": 2, "batch_size": 4,
               "client_group": 2, **structure}
  return fr.make_neural_algorithm(name, model=MODEL, cohort=3, **structure)


def programs(data, names=NAMES):
  """{name: (its algorithm, the program that runs it, that program's hparams)}."""
  peers = [make(n) for n in names]
  return {n: (a, *nn_program.program(a, HP, peers, data.x[0, 0])) for n, a in zip(names, peers)}


def test_every_member_runs_as_one_family_program():
  data = small_data()
  made = programs(data)
  assert {type(p) for _, p, _ in made.values()} == {partial.SharedProgram}
  assert len({p for _, p, _ in made.values()}) == 1  # equal (hashable): one jit cache entry
  family_program = made["fedrep"][1]
  assert (family_program.local_epochs, family_program.head_epochs,
          family_program.ft_epochs) == (2, 10, 2)  # fedrep-star's 10 head epochs


@pytest.mark.slow  # the fast tier keeps test_the_members_compile_one_program_between_them
@pytest.mark.parametrize("name", NAMES)
def test_a_member_gives_its_own_algorithms_numbers(name):
  data = small_data()
  algorithm, program, hparams = programs(data)[name]
  key = jax.random.key(3)
  own = fr.run(algorithm, data, HP, key, 4, chunk=2, eval_every=2, progress=False)
  run = fr.run(program, data, hparams, key, 4, chunk=2, eval_every=2, progress=False)
  np.testing.assert_allclose(run.metrics["train_loss"], own.metrics["train_loss"], rtol=2e-5)
  np.testing.assert_allclose(run.eval_metrics["test_accuracy"],
                             own.eval_metrics["test_accuracy"], rtol=1e-6)
  for path, leaf in own.state.shared.items():  # the server's copy of what it averages
    np.testing.assert_allclose(run.state.shared[path], leaf, rtol=2e-5, atol=1e-6)
  for path, leaf in own.state.personal.items():  # each client's own copy of the rest
    np.testing.assert_allclose(run.state.personal[path], leaf, rtol=2e-5, atol=1e-6)


def test_the_members_compile_one_program_between_them(compiles):
  data = small_data()
  made = programs(data)
  _, program, hparams = made["fedrep"]
  fr.run(program, data, hparams, jax.random.key(0), 3, progress=False)  # chunk 3: new here
  assert compiles.count > 0
  compiles.reset()
  for name in NAMES[1:]:
    _, program, hparams = made[name]
    fr.run(program, data, hparams, jax.random.key(0), 3, progress=False)
  assert compiles.count == 0


def test_an_algorithm_outside_the_family_or_alone_keeps_its_own_program():
  data = small_data()
  example = data.x[0, 0]
  fedprox, fedrep = make("fedprox"), make("fedrep")  # FedProx derives from FedAvg
  assert nn_program.program(fedprox, HP, [fedprox, fedrep], example) == (fedprox, HP)
  assert nn_program.program(fedrep, HP, [fedrep, fedprox], example) == (fedrep, HP)
  other_model = fr.make_neural_algorithm("fedper", model=fr.make_model("digits-cnn", 10),
                                         cohort=3)
  assert nn_program.program(fedrep, HP, [fedrep, other_model], example) == (fedrep, HP)


@pytest.mark.parametrize("base,variant,field,most", [  # the fast tier keeps the family's
    pytest.param("fedprox", "fedprox-ft", "ft_epochs", 2,  # one program (members, below)
                 marks=pytest.mark.slow),
    pytest.param("scaffold", "scaffold-ft", "ft_epochs", 2, marks=pytest.mark.slow),
    pytest.param("flute", "flute-star", "head_epochs", 10, marks=pytest.mark.slow)])
def test_variants_that_differ_in_traced_epochs_share_one_program(base, variant, field, most):
  data = small_data()
  peers = [make(base), make(variant)]
  made = [nn_program.program(a, HP, peers, data.x[0, 0]) for a in peers]
  assert made[0][0] == made[1][0] and getattr(made[0][0], field) == most
  assert made[0][0].name == f"{base}+{variant}"
  key = jax.random.key(5)
  for algorithm, (program, hparams) in zip(peers, made):
    own = fr.run(algorithm, data, HP, key, 2, eval_every=1, progress=False)
    run = fr.run(program, data, hparams, key, 2, eval_every=1, progress=False)
    np.testing.assert_allclose(run.metrics["train_loss"], own.metrics["train_loss"],
                               rtol=2e-5)
    np.testing.assert_allclose(run.eval_metrics["test_accuracy"],
                               own.eval_metrics["test_accuracy"], rtol=1e-6)


def test_skipped_epochs_leave_params_as_fewer_epochs_do():
  data = small_data()
  x, y, count = data.x[0], data.y[0], data.counts[0]
  params = {"w": jax.numpy.zeros((64, 10))}
  loss = lambda p, xb, yb, wb, k: train.cross_entropy(xb.reshape(len(xb), -1) @ p["w"], yb, wb)
  key = jax.random.key(1)
  fewer = train.sgd_epochs(loss, params, x, y, count, key, HP, epochs=2, batch_size=4)
  masked = train.sgd_epochs(loss, params, x, y, count, key, HP, epochs=5, batch_size=4,
                            active=jax.numpy.int32(2))
  np.testing.assert_allclose(masked[0]["w"], fewer[0]["w"], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(masked[1], fewer[1], rtol=1e-6)
  frozen = train.sgd_epochs(loss, params, x, y, count, key, HP, epochs=2, batch_size=4,
                            trainable={"w": jax.numpy.bool_(False)})
  np.testing.assert_array_equal(frozen[0]["w"], params["w"])


@pytest.mark.slow
def test_digits_personalized_compiles_one_program_of_each_kind_for_its_six_algorithms(
    compiles):
  """The recipe's FedRep, FedPer, LG-FedAvg, FedAvg, FedAvg-FT and local only share one init,
  one round chunk and one evaluation (each algorithm compiled its own three before)."""
  rows, config = fr.run_recipe("digits-personalized", quick=True, progress=False, seeds=1,
                               overrides=["rounds=2", "eval_every=1", "num_clients=10"])
  assert len(config.algorithms) == 6
  assert {r["algorithm"] for r in rows} == set(config.algorithms)
  for program in ("jit(_init)", "jit(_run_chunk)", "jit(_evaluate)"):
    assert compiles.names.count(program) == 1, compiles.names
  # Besides them only the seeds' keys compile: data, hparams and members are placed from
  # the host, with no eager device op.
  assert set(compiles.names) <= {"jit(_init)", "jit(_run_chunk)", "jit(_evaluate)",
                                 "jit(_seed_keys)", "jit(run_keys)"}, compiles.names


def test_preparing_a_neural_run_compiles_no_program(compiles):
  """Client datasets stacked over seeds, hparams, the family's program and its member
  come from the host: no eager device op compiles a single-use program."""
  seeds = [fr.digits.federated(12, "classes", 2, seed=s) for s in (0, 1)]
  data = fr.stack_datasets(seeds)  # padded to the largest client
  assert fr.stack(seeds[:1] * 2).x.shape == (2, *seeds[0].x.shape)  # equal shapes
  hp = fr.nn_hparams(lr=0.05, momentum=0.5, weight_decay=1e-4)
  peers = [make(n) for n in NAMES]
  example = jax.ShapeDtypeStruct(data.x.shape[3:], data.x.dtype)
  made = [nn_program.program(a, hp, peers, example) for a in peers]
  assert compiles.count == 0, compiles.names
  assert data.x.shape[:2] == (2, 12) and isinstance(data.x, jax.Array)
  assert all(isinstance(leaf, jax.Array) for _, h in made for leaf in jax.tree.leaves(h))
  keys = jax.random.split(jax.random.key(0), 3)  # no host form: stacked on the device
  np.testing.assert_array_equal(jax.random.key_data(fr.stack([keys, keys])[1]),
                                jax.random.key_data(keys))
