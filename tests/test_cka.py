"""Linear CKA (`nn.cka`) against its closed form, and the layer outputs it compares."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedjax_rep.nn import cka, models
from fedjax_rep.nn import params as params_lib


def numpy_cka(x, y) -> float:
  """CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F) of column-centred X, Y, in
  float64."""
  x = np.asarray(x, np.float64) - np.mean(x, axis=0)
  y = np.asarray(y, np.float64) - np.mean(y, axis=0)
  return (np.linalg.norm(y.T @ x) ** 2
          / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


def orthogonal(rng, size) -> np.ndarray:
  return np.linalg.qr(rng.normal(size=(size, size)))[0]


SHAPES = st.sampled_from([(12, 3, 5), (20, 7, 2), (6, 9, 11), (30, 1, 4)])  # (n, p, q)


@settings(max_examples=20, deadline=None)
@given(shape=SHAPES, seed=st.integers(0, 2 ** 31 - 1), scale=st.floats(0.01, 100.0))
def test_cka_is_its_closed_form_symmetric_and_invariant(shape, seed, scale):
  """Equal to the numpy computation; symmetric; 1 for identical features; unchanged by an
  orthogonal transform or an isotropic scaling of either argument, and by a shift of
  either's columns (centring); in [0, 1]."""
  n, p, q = shape
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, p)).astype(np.float32)
  y = (x @ rng.normal(size=(p, q)) + 0.5 * rng.normal(size=(n, q))).astype(np.float32)
  value = float(cka.linear_cka(x, y))
  np.testing.assert_allclose(value, numpy_cka(x, y), rtol=1e-4, atol=1e-6)
  assert -1e-6 <= value <= 1 + 1e-5
  np.testing.assert_allclose(float(cka.linear_cka(y, x)), value, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(float(cka.linear_cka(x, x)), 1.0, rtol=1e-5)
  moved_x = (scale * x @ orthogonal(rng, p) + rng.normal(size=p)).astype(np.float32)
  moved_y = (y @ orthogonal(rng, q) / scale - 3.0).astype(np.float32)
  for a, b in ((moved_x, y), (x, moved_y), (moved_x, moved_y)):
    np.testing.assert_allclose(float(cka.linear_cka(a, b)), value, rtol=2e-4, atol=1e-5)


def test_the_gram_side_gives_the_feature_side_s_numbers():
  """Wide features (p q > n^2) go through the n x n Gram matrices: the same value as
  numpy's feature-side formula, under jit too."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(8, 40)).astype(np.float32)
  y = (x[:, :30] + rng.normal(size=(8, 30))).astype(np.float32)
  assert 8 * 8 < 40 * 30
  np.testing.assert_allclose(float(jax.jit(cka.linear_cka)(x, y)), numpy_cka(x, y),
                             rtol=1e-4)
  np.testing.assert_allclose(float(cka.linear_cka(x, x)), 1.0, rtol=1e-5)


def test_unrelated_features_score_low_and_constant_ones_nan():
  rng = np.random.default_rng(1)
  x, y = rng.normal(size=(2, 2000, 3)).astype(np.float32)
  assert float(cka.linear_cka(x, y)) < 0.01
  assert np.isnan(float(cka.linear_cka(x, np.ones((2000, 2), np.float32))))


@pytest.mark.parametrize("name", ["digits-mlp", "digits-cnn"])
def test_layer_outputs_are_the_layers_own(name):
  """Each layer's output before its activation, in network order; the head's is the
  logits; the MLP's by hand: fc1 = x W1 + b1, fc2 = relu(fc1) W2 + b2, head = relu(fc2) Wh +
  bh."""
  model = models.make_model(name, 10)
  flat = params_lib.flatten(models.init_params(model, jax.random.key(0), (8, 8, 1)))
  flat = {p: v + 0.01 for p, v in flat.items()}  # nonzero biases
  x = jax.random.uniform(jax.random.key(1), (6, 8, 8, 1))
  outputs = cka.layer_outputs(model, flat, x)
  expected = (["body/fc1", "body/fc2", "head"] if name == "digits-mlp"
              else ["body/conv1", "body/fc1", "head"])
  assert list(outputs) == cka.layers(flat) == expected
  np.testing.assert_allclose(outputs["head"], model.apply({"params": params_lib.unflatten(
      flat)}, x), rtol=1e-6)
  if name == "digits-mlp":
    h = np.asarray(x, np.float64).reshape(6, -1)
    for layer in ("body/fc1", "body/fc2", "head"):
      h = h @ np.asarray(flat[f"{layer}/kernel"], np.float64) + np.asarray(
          flat[f"{layer}/bias"], np.float64)
      np.testing.assert_allclose(outputs[layer], h, rtol=1e-5, atol=1e-6)
      h = np.maximum(h, 0.0)
  else:
    assert outputs["body/conv1"].shape == (6, 6 * 6 * 16)


def test_layer_cka_is_one_for_the_same_model_and_lower_where_a_layer_changed():
  model = models.make_model("digits-mlp", 10)
  flat = params_lib.flatten(models.init_params(model, jax.random.key(0), (8, 8, 1)))
  x = jax.random.uniform(jax.random.key(1), (50, 8, 8, 1))
  np.testing.assert_allclose(cka.layer_cka(model, flat, flat, x), np.ones(3), rtol=1e-5)
  changed = {**flat, "body/fc2/kernel": jax.random.normal(jax.random.key(2),
                                                          flat["body/fc2/kernel"].shape)}
  values = np.asarray(jax.jit(lambda a, b: cka.layer_cka(model, a, b, x))(flat, changed))
  np.testing.assert_allclose(values[0], 1.0, rtol=1e-5)  # fc1 is untouched
  assert values[1] < 0.95 and values[2] < 0.95
  assert jnp.all(jnp.isfinite(values))
