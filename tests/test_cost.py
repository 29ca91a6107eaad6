"""What a round costs (`nn.cost`): bytes against the model's parameter counts, FLOPs that
count loops by their trip counts."""

import jax
import jax.numpy as jnp
import pytest

import fedjax_rep as fr
from fedjax_rep.data import federated
from fedjax_rep.data import flat
from fedjax_rep.nn import cost
from fedjax_rep.nn import params as params_lib

HP = fr.nn_hparams(lr=0.1, momentum=0.5, weight_decay=1e-3)
MODEL = fr.make_model("digits-mlp", 10)  # fc 64->64->32, head 32->10


def small_data(num_clients=4):
  return jax.tree.map(lambda a: a[:num_clients], fr.digits.federated(40, "classes", 2, seed=0))


def make(name, **structure):
  structure = {"cohort": 2, "local_epochs": 1, "head_epochs": 1, "batch_size": 8,
               "client_group": None, **structure}
  return fr.make_neural_algorithm(name, model=MODEL, **structure)


def param_bytes(select=lambda path: True) -> int:
  flat_params = params_lib.flatten(jax.eval_shape(
      MODEL.init, jax.random.key(0), jnp.zeros((1, 8, 8, 1)))["params"])
  return sum(v.size * 4 for p, v in flat_params.items() if select(p))


@pytest.mark.parametrize("name, expected", [
    ("fedrep", lambda: param_bytes(lambda p: p.startswith("body/"))),
    ("lg-fedavg", lambda: param_bytes(lambda p: p.startswith(("body/fc2/", "head/")))),
    ("fedavg", param_bytes),
    ("local", lambda: 0),
    ("scaffold", lambda: 2 * param_bytes()),
    ("l2gd", lambda: round(0.2 * param_bytes())),  # the model, in a share l2gd_p of rounds
])
def test_bytes_are_the_exchanged_parameters(name, expected):
  assert cost.communication(make(name), small_data(), HP) == {
      "upload_bytes": expected(), "download_bytes": expected()}


def test_bytes_of_a_flat_store_and_of_stacked_runs_are_one_runs():
  data = small_data()
  want = cost.communication(make("scaffold"), data, HP)
  assert cost.communication(make("scaffold"), flat.from_padded(data), HP) == want
  assert cost.communication(make("scaffold"), federated.stack([data, data]), HP) == want


@pytest.mark.slow  # the fast tier keeps the loop bodies counted by their trip counts (below)
def test_round_flops_grow_with_local_epochs():
  data = small_data()
  f1, f2, f3 = (cost.round_flops(make("fedavg", local_epochs=e), data, HP) for e in (1, 2, 3))
  assert 0 < f1 < f2 < f3
  assert f3 - f2 == pytest.approx(f2 - f1, rel=1e-4)  # every epoch: the same steps
  assert f3 > 2.5 * f1  # the epochs' steps dominate a round
  for same in (federated.stack([data, data]), flat.from_padded(data)):  # one run's clients
    assert cost.round_flops(make("fedavg"), same, HP) == pytest.approx(f1, rel=1e-6)


def test_flops_count_loop_bodies_by_their_trip_counts():
  x = jnp.ones((32, 32))
  matmul = 2 * 32**3

  def scan(x):
    return jax.lax.scan(lambda c, _: (c @ c, None), x, None, length=7)[0]

  def fori(x, n):  # a traced trip count bounded by min(., 5)
    return jax.lax.fori_loop(0, jnp.minimum(n, 5), lambda i, c: c @ c, x)

  def nested(x):
    return jax.lax.scan(lambda c, _: (jax.lax.fori_loop(0, 3, lambda i, d: d @ d, c), None),
                        x, None, length=4)[0]

  def branch(p, x):
    return jax.lax.cond(p, lambda x: scan(x), lambda x: x @ x, x)

  assert cost.flops(scan, x) == pytest.approx(7 * matmul, rel=1e-3)
  assert cost.flops(fori, x, 9) == pytest.approx(5 * matmul, rel=1e-3)
  assert cost.flops(nested, x) == pytest.approx(12 * matmul, rel=1e-3)
  assert cost.flops(branch, True, x) == pytest.approx(7 * matmul, rel=1e-3)
