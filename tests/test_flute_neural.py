"""Neural FLUTE (nn/flute.py) and the neural-collapse terms (nn/neural_collapse.py) against
the float64 numpy reference (flute_reference): a tiny MLP, hand-made clients that hold a
few classes each (one holds a single class), float32 tolerance."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_rep.data.federated import client_datasets
from fedjax_rep.data.flat import flat_clients
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import models
from fedjax_rep.nn import neural_collapse as nc
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.fedper import FedPer
from fedjax_rep.nn.flute import Flute
import flute_reference as fref
import nn_reference as ref
from test_nn_reference import initial_state, to_reference

MODEL = models.make_model("digits-mlp", 10)
STRUCTURE = dict(local_epochs=1, head_epochs=2, batch_size=4, client_group=2)
# Larger than the defaults, so that two rounds show them.
LAMBDAS = dict(flute_nc=0.25, flute_head_norm=0.01, flute_feature_norm=0.01, flute_server_lr=0.5)
ZERO = dict(flute_nc=0.0, flute_head_norm=0.0, flute_feature_norm=0.0, flute_server_lr=0.0)


def flute_hparams(**lambdas):
  """The hparams of these tests: FLUTE's weights LAMBDAS (its traced options), those of
  `lambdas` changed."""
  return hparams_lib.hparams(lr=0.1, momentum=0.5, weight_decay=1e-3, **{**LAMBDAS, **lambdas})


HP = flute_hparams()
COUNTS = [7, 8, 10, 11, 13, 14]  # m = 14: 4 steps of 4, some partial, some empty
TEST_COUNTS = [3, 4, 5, 3, 4, 5]
WIDE_COUNTS = [3, 300, 5, 60, 3, 150]  # heavy-tailed: 3 samples next to 300
CLASSES = [[0, 1, 2], [2, 3], [4, 5, 6, 7], [7, 8, 9, 0], [1, 5, 9], [3]]
# (clients, mask): cohorts of 4 (two groups of 2), the second round with one client masked.
ROUNDS = [(np.array([4, 1, 3, 0]), np.array([True, True, True, True])),
          (np.array([0, 4, 2, 5]), np.array([True, False, True, True]))]
RTOL, ATOL = 1e-4, 1e-5


def make_data(seed=0, counts=COUNTS, layout=client_datasets):
  """6 clients of 8x8x1 inputs (class means + noise), client i's labels drawn from
  CLASSES[i], `counts` train rows padded to the largest (COUNTS: 14) and TEST_COUNTS test
  rows padded to 5 (layout flat_clients: in one flat store)."""
  rng = np.random.default_rng(seed)
  means = rng.normal(size=(10, 8, 8, 1))

  def sample(counts):
    y = np.concatenate([rng.choice(c, k) for c, k in zip(CLASSES, counts)])
    x = means[y] + rng.normal(size=(len(y), 8, 8, 1))
    parts = np.split(np.arange(len(y)), np.cumsum(counts)[:-1])
    return x.astype(np.float32), y.astype(np.int32), parts

  return layout(*sample(counts), *sample(TEST_COUNTS), 10)


def make(**fields):
  return Flute(model=MODEL, cohort=3, **{**STRUCTURE, **fields})


def random_kernels(n, features=8, classes=10, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(n, features, classes)),
                     jnp.float32)


def masks(*class_lists, num_classes=10):
  out = np.zeros((len(class_lists), num_classes), bool)
  for i, c in enumerate(class_lists):
    out[i, c] = True
  return out


def simplex_etf(points: int, features: int, seed=0) -> np.ndarray:
  """[features, points]: a rotated, scaled simplex ETF (columns P (I - 1 1^T / k) 3)."""
  q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(features, points)))
  return 3.0 * q @ (np.eye(points) - np.ones((points, points)) / points)


_JITTED = {}


def jitted(algorithm, method):
  if (algorithm, method) not in _JITTED:
    _JITTED[algorithm, method] = jax.jit(getattr(algorithm, method))
  return _JITTED[algorithm, method]


# -- the NC term and the NC2 metrics -------------------------------------------------------
def test_reference_nc_gradient_matches_finite_differences():
  kernel = np.random.default_rng(0).normal(size=(5, 4))
  for classes, size in [(np.array([True] * 4), 4), (np.array([True, False, True, True]), 4),
                        (np.array([True, False, True, True]), 3)]:
    numeric = np.zeros_like(kernel)
    for j in np.ndindex(kernel.shape):
      step = np.zeros_like(kernel)
      step[j] = 1e-6
      numeric[j] = (fref.etf_distance(kernel + step, classes, size)
                    - fref.etf_distance(kernel - step, classes, size)) / 2e-6
    np.testing.assert_allclose(fref.etf_distance_grad(kernel, classes, size), numeric,
                               rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("classes", [list(range(10)), [1, 4, 7], [2, 9], [5]])
def test_nc_term_and_its_gradient_match_the_reference(classes):
  kernel = random_kernels(1, seed=len(classes))[0]
  mask = masks(classes)[0]
  value, grad = jax.jit(jax.value_and_grad(nc.nc_term))(kernel, jnp.asarray(mask))
  kernel64 = np.asarray(kernel, np.float64)
  np.testing.assert_allclose(value, fref.nc_term(kernel64, mask), rtol=RTOL)
  np.testing.assert_allclose(grad, fref.etf_distance_grad(kernel64, mask, 10), rtol=RTOL,
                             atol=ATOL)


def test_class_mask_reads_only_the_real_labels():
  y = jnp.array([[3, 1, 3, 7, 7], [2, 0, 0, 0, 0]])  # padding rows hold junk labels
  expected = masks([1, 3], [2])
  np.testing.assert_array_equal(nc.class_mask(y, jnp.array([3, 1]), 10), expected)
  np.testing.assert_array_equal(nc.class_mask(y[0], 3, 10), expected[0])


def test_nc2_metrics_match_the_reference():
  kernels = random_kernels(4)
  classes = masks(list(range(10)), [1, 4, 7], [2, 9], [5])  # the last: one class
  metrics = jax.jit(nc.nc2_metrics)(kernels, jnp.asarray(classes))
  expected = fref.nc2_metrics(np.asarray(kernels, np.float64), classes)
  for name, value in expected.items():
    np.testing.assert_allclose(metrics[name], value, rtol=RTOL, err_msg=name)


def test_nc2_metrics_vanish_on_a_simplex_etf_and_are_positive_otherwise():
  etf = simplex_etf(10, 12)
  full = jnp.asarray(np.stack([etf, etf @ np.diag(np.full(10, 0.5))]), jnp.float32)
  nc2_metrics = jax.jit(nc.nc2_metrics)
  metrics = nc2_metrics(full, jnp.ones((2, 10), bool))
  assert float(metrics["global_nc2"]) < 1e-5 and float(metrics["local_nc2"]) < 1e-5
  # A client with 3 classes whose heads form a 3-point ETF (the others 0) is at the local
  # optimum (Obs. B.2), not at the global one (Obs. B.3).
  local = np.zeros((12, 10))
  local[:, [1, 4, 7]] = simplex_etf(3, 12, seed=1)
  metrics = nc2_metrics(jnp.asarray(local[None], jnp.float32), jnp.asarray(masks([1, 4, 7])))
  assert float(metrics["local_nc2"]) < 1e-5 and float(metrics["global_nc2"]) > 0.1
  # Its heads at the 10-class ETF's angles reach NC_i's floor 1 - ||pattern||_F.
  restricted = np.zeros((12, 10))
  restricted[:, [1, 4, 7]] = etf[:, [1, 4, 7]]
  floor = 1 - np.linalg.norm(fref.target(masks([1, 4, 7])[0], 10))
  metrics = nc2_metrics(jnp.asarray(restricted[None], jnp.float32),
                        jnp.asarray(masks([1, 4, 7])))
  np.testing.assert_allclose(metrics["global_nc2"], floor, rtol=1e-5)
  metrics = nc2_metrics(random_kernels(2, features=12),
                        jnp.asarray(masks(list(range(10)), [1, 4, 7])))
  assert float(metrics["global_nc2"]) > 0.1 and float(metrics["local_nc2"]) > 0.1


# -- the server's NC step ------------------------------------------------------------------
def test_nc_step_moves_only_the_trained_heads_and_decreases_their_nc():
  kernels = random_kernels(4)
  classes = jnp.asarray(masks(list(range(10)), [1, 4, 7], [2, 9], [0, 3, 5, 6]))
  trained = jnp.array([True, False, True, True])
  terms = jax.vmap(nc.nc_term)
  algorithm = make()
  stepped = jax.jit(algorithm.nc_step)(kernels, classes, trained,
                                       flute_hparams(flute_server_lr=0.05))
  np.testing.assert_array_equal(stepped[1], kernels[1])
  before, after = terms(kernels, classes), terms(stepped, classes)
  assert float(jnp.sum(after[trained])) < float(jnp.sum(before[trained]))
  for i in (0, 2, 3):
    k = np.asarray(kernels[i], np.float64)
    expected = k - 0.05 / 3 * fref.etf_distance_grad(k, np.asarray(classes[i]), 10)
    np.testing.assert_allclose(stepped[i], expected, rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_a_round_changes_only_the_heads_of_clients_that_trained():
  data = make_data()
  algorithm = make()
  state = initial_state(algorithm, data)
  clients, mask = ROUNDS[1]
  new, _ = jitted(algorithm, "masked_round")(state, jax.random.key(2), data, HP,
                                             jnp.asarray(clients), jnp.asarray(mask))
  for path, old in state.personal.items():
    for c in range(data.num_clients):
      if c in (0, 2, 5):  # sampled and unmasked
        assert not np.allclose(new.personal[path][c], old[c]), (path, c)
      else:  # unsampled (1, 3) or masked (4)
        np.testing.assert_array_equal(new.personal[path][c], old[c], err_msg=f"{path} {c}")


# -- local training ------------------------------------------------------------------------
@pytest.mark.parametrize(  # FLUTE, FLUTE*; FLUTE on heavy tails, padded and in a flat store
    "head_epochs, counts, layout",  # (the fast tier keeps test_nn_reference's flat stores)
    [(0, COUNTS, client_datasets), (2, COUNTS, client_datasets),
     (0, WIDE_COUNTS, client_datasets),
     pytest.param(0, WIDE_COUNTS, flat_clients, marks=pytest.mark.slow)],
    ids=["flute", "flute-star", "flute-wide", "flute-wide-flat"])
def test_rounds_match_the_reference(head_epochs, counts, layout):
  data = make_data(counts=counts, layout=layout)
  algorithm = make(head_epochs=head_epochs)
  state = initial_state(algorithm, data)
  shared, personal = to_reference(state, data.num_clients)
  key = jax.random.key(3)
  step = jitted(algorithm, "masked_round")
  lambdas = dict(feature_norm=LAMBDAS["flute_feature_norm"], nc=LAMBDAS["flute_nc"],
                 head_norm=LAMBDAS["flute_head_norm"])
  for t, (clients, mask) in enumerate(ROUNDS):
    round_key = jax.random.fold_in(key, t)
    state, metrics = step(state, round_key, data, HP, jnp.asarray(clients), jnp.asarray(mask))
    shared, personal, loss = fref.masked_round(
        shared, personal, round_key, ref.per_client(data), HP, clients, mask,
        server_lr=LAMBDAS["flute_server_lr"], local_epochs=STRUCTURE["local_epochs"],
        head_epochs=head_epochs, batch_size=STRUCTURE["batch_size"], **lambdas)
    np.testing.assert_allclose(metrics["train_loss"], loss, rtol=RTOL, atol=ATOL)
  for p, v in state.shared.items():
    np.testing.assert_allclose(v, shared[p], rtol=RTOL, atol=ATOL, err_msg=p)
  for p, v in state.personal.items():
    np.testing.assert_allclose(v, np.stack([q[p] for q in personal]), rtol=RTOL, atol=ATOL,
                               err_msg=p)


def client_update(algorithm, data, i=3, key=jax.random.key(5), hp=HP):  # noqa: B008
  state = initial_state(algorithm, data)
  personal = jax.tree.map(lambda p: p[i], state.personal)
  return jitted(algorithm, "client_update")(state.shared, personal, data.x[i], data.y[i],
                                            data.counts[i], key, hp,
                                            algorithm.round_info(state, data.num_clients))


@pytest.mark.slow
@pytest.mark.parametrize("field", ["flute_nc", "flute_head_norm", "flute_feature_norm"])
def test_each_regulariser_changes_the_local_training(field):
  data = make_data()
  plain = client_update(make(), data, hp=flute_hparams(**ZERO))
  regularised = client_update(make(), data,
                              hp=flute_hparams(**{**ZERO, field: LAMBDAS[field]}))
  for part in (0, 1):  # the body and the head both move
    assert not all(np.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(
        jax.tree.leaves(plain[part]), jax.tree.leaves(regularised[part])))


def test_without_regularisers_flute_is_its_plain_schedule():
  """All weights 0: local_epochs of FedPer's joint training, then head epochs with the body
  frozen (`train_head`), with the keys (key_joint, key_head) = split(key)."""
  data = make_data()
  algorithm = make()
  body, head, loss = client_update(algorithm, data, hp=flute_hparams(**ZERO))
  key_joint, key_head = jax.random.split(jax.random.key(5))
  fedper = FedPer(**{f.name: getattr(algorithm, f.name)
                     for f in dataclasses.fields(Personalized) if f.name != "name"})
  state = initial_state(algorithm, data)
  i = 3
  plain_body, plain_head, plain_loss = jax.jit(fedper.client_update)(
      state.shared, jax.tree.map(lambda p: p[i], state.personal), data.x[i], data.y[i],
      data.counts[i], key_joint, HP, fedper.round_info(state, data.num_clients))
  plain_head, _ = jax.jit(lambda: algorithm.train_head(
      plain_body, plain_head, data.x[i], data.y[i], data.counts[i], key_head, HP,
      STRUCTURE["head_epochs"]))()
  for new, plain in [(body, plain_body), (head, plain_head), (loss, plain_loss)]:
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), new,
                 plain)


# -- compiles and evaluation ---------------------------------------------------------------
def test_a_jitted_round_compiles_once_across_rounds(compiles):
  data = make_data()
  algorithm = make()
  state = initial_state(algorithm, data)
  step = jitted(algorithm, "masked_round")
  (clients, mask), (clients2, mask2) = ROUNDS
  state, _ = step(state, jax.random.key(0), data, HP, jnp.asarray(clients), jnp.asarray(mask))
  jax.block_until_ready(state)
  compiles.reset()
  state, _ = step(state, jax.random.key(1), data, HP, jnp.asarray(clients2),
                  jnp.asarray(mask2))
  jax.block_until_ready(state)
  assert compiles.count == 0


def test_evaluate_adds_the_nc2_metrics_of_every_clients_head():
  data = make_data()
  algorithm = make()
  state = initial_state(algorithm, data)
  metrics = jitted(algorithm, "evaluate")(state, data, HP)
  assert set(metrics) == {"test_accuracy", "test_accuracy_weighted", "test_accuracy_std",
                          "test_accuracy_p10", "test_clients", "global_nc2", "local_nc2"}
  classes = np.stack([fref.class_mask(data.y[i], int(data.counts[i]), 10)
                      for i in range(data.num_clients)])
  expected = fref.nc2_metrics(np.asarray(state.personal["head/kernel"], np.float64), classes)
  for name, value in expected.items():
    np.testing.assert_allclose(metrics[name], value, rtol=RTOL, err_msg=name)
