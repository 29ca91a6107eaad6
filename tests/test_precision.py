"""Precision (`make_model(..., precision=...)`, the recipes' `precision` setting): the
default 'float32' runs every matmul and conv, forward and backward, at
jax.lax.Precision.HIGHEST (on the CPU the same numbers as jax's default, 'tf32'); bf16
computes in bfloat16 with float32 params, gradients, optimiser state and outputs."""

import csv
import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.nn import models, train
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.conv import conv_im2col, max_pool2
from fedjax_rep.experiments import config as cfg
from fedjax_rep.recipes.kit import neural
from fedjax_rep.experiments import recipe_registry

INPUTS = {"digits-mlp": (8, 8, 1), "digits-cnn": (8, 8, 1), "cifar10-cnn": (32, 32, 3),
          "synthetic-mlp": (60,), "sent140-lstm": (12,)}
VOCAB = 50
# Every model; the fast tier keeps the MLPs and CNNs, the slow one adds the LSTM.
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n == "sent140-lstm" else n
          for n in sorted(INPUTS)]
# The recipes that build a model, and so take `precision`.
NEURAL_RECIPES = ("digits-personalized", "fedavg-ft-neural", "fedavg-ft-fig2", "fedavg-ft-fig5",
                  "flute-table1", "srpfl-neural",
                  "fedrep-table1-cifar10", "fedrep-table1-cifar100", "fedrep-table1-femnist",
                  "fedrep-table1-sent140", "table1-synthetic", "fedrep-fig5", "fedrep-fig6")


def _model(name, precision=None, **kw):
  options = dict(vocab_size=VOCAB) if name == "sent140-lstm" else {}
  options.update(kw)
  if precision is not None:
    options["precision"] = precision
  return models.make_model(name, **options)


def _inputs(name, batch=16, seed=1):
  rng = np.random.default_rng(seed)
  if name == "sent140-lstm":
    tokens = rng.integers(1, VOCAB, (batch, *INPUTS[name])).astype(np.int32)
    lengths = rng.integers(0, INPUTS[name][0] + 1, batch)  # right padding, some all-padding
    return np.where(np.arange(INPUTS[name][0]) < lengths[:, None], tokens, 0)
  return rng.random((batch, *INPUTS[name]), np.float32)


def _params(model, name):
  return models.init_params(model, jax.random.key(0), INPUTS[name])


def _dtypes(tree):
  return {jnp.dtype(leaf.dtype) for leaf in jax.tree.leaves(tree)}


def _submodules(model):
  """The Classifier and its body (make_model gives both the same dtype)."""
  return [model, model.body]


@pytest.mark.parametrize("name", MODELS)
def test_default_precision_is_float32_throughout(name):
  """The default (and precision='float32') leaves every module's dtype unset, as before the
  option existed: a forward pass casts nothing (the body models' jaxpr has no
  convert_element_type) and nothing is bfloat16; its matmul precision is HIGHEST."""
  model = _model(name)
  assert model == _model(name, "float32")
  assert all(m.dtype is None for m in _submodules(model))
  assert all(m.precision == jax.lax.Precision.HIGHEST for m in _submodules(model))
  params = _params(model, name)
  jaxpr = str(jax.make_jaxpr(model.apply)({"params": params}, _inputs(name)))
  assert "bf16" not in jaxpr
  if name != "sent140-lstm":  # the LSTM's token and length bookkeeping has int casts
    assert "convert_element_type" not in jaxpr


def _mlp_reference(params, x):
  """digits-mlp's forward pass written out in plain jax.numpy."""
  h = x.reshape(x.shape[0], -1)
  for layer in ("fc1", "fc2"):
    h = jax.nn.relu(h @ params["body"][layer]["kernel"] + params["body"][layer]["bias"])
  return h @ params["head"]["kernel"] + params["head"]["bias"]


def _cnn_reference(params, x):
  """cifar10-cnn's (im2col) forward pass written out with the conv module's functions."""
  h = x
  for layer in ("conv1", "conv2"):
    p = params["body"][layer]
    h = max_pool2(jax.nn.relu(conv_im2col(h, p["kernel"]) + p["bias"]))
  h = h.reshape(h.shape[0], -1)
  for layer in ("fc1", "fc2"):
    h = jax.nn.relu(h @ params["body"][layer]["kernel"] + params["body"][layer]["bias"])
  return h @ params["head"]["kernel"] + params["head"]["bias"]


@pytest.mark.parametrize("name,reference,kw", [
    ("digits-mlp", _mlp_reference, {}),
    ("cifar10-cnn", _cnn_reference, {"conv_impl": "im2col"}),
])
def test_default_precision_logits_are_bit_identical_to_float32_reference(name, reference, kw):
  """The same logits as the forward pass written out, with float32 matmuls (HIGHEST)."""
  model = _model(name, **kw)
  params = _params(model, name)
  x = _inputs(name)
  logits = jax.jit(model.apply)({"params": params}, x)
  assert logits.dtype == jnp.float32
  with jax.default_matmul_precision("highest"):
    want = jax.jit(reference)(params, x)
  np.testing.assert_array_equal(logits, want)


# The models (and conv lowerings) whose lowered programs the precision tests inspect.
# (The fast tier keeps the MLPs and CNNs; the LSTM runs in the slow tier.)
LOWERED = [("digits-mlp", {}), ("synthetic-mlp", {}), ("digits-cnn", {"conv_impl": "xla"}),
           ("cifar10-cnn", {"conv_impl": "im2col"}), ("cifar10-cnn", {"conv_impl": "xla"}),
           pytest.param("sent140-lstm", {}, marks=pytest.mark.slow)]


def _matmuls(model, name):
  """The dot_general and convolution lines of the lowered (StableHLO) text of the model's
  forward pass and of the gradient of a loss of its logits, in that order."""
  params, x = _params(model, name), _inputs(name, batch=4)
  y = jnp.arange(4) % model.num_classes
  loss = lambda p: train.cross_entropy(model.apply({"params": p}, x), y, jnp.ones(4))
  texts = (jax.jit(lambda p: model.apply({"params": p}, x)).lower(params).as_text(),
           jax.jit(jax.grad(loss)).lower(params).as_text())
  return [[line for line in text.splitlines()
           if re.search(r"stablehlo\.(dot_general|convolution)", line)] for text in texts]


@pytest.mark.parametrize("name,kw", LOWERED)
def test_float32_runs_every_matmul_and_conv_at_highest_precision(name, kw):
  """'float32': every dot and conv of the forward pass and of the gradient lowers with
  precision HIGHEST (float32 products on every backend, also under a lower default matmul
  precision); 'tf32' and 'bf16' leave every one at the default."""
  for precision in models.PRECISIONS:
    for lines in _matmuls(_model(name, precision, **kw), name):
      assert lines
      highest = [line for line in lines if "HIGHEST" in line]
      assert highest == (lines if precision == "float32" else []), (precision, lines)
  with jax.default_matmul_precision("bfloat16"):
    forward, backward = _matmuls(_model(name, "float32", **kw), name)
  assert all("HIGHEST" in line for line in forward + backward)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's float32 dots only")
@pytest.mark.parametrize("name,kw", LOWERED)
def test_float32_and_tf32_are_bit_identical_on_the_cpu(name, kw):
  """On the CPU, jax's default matmul precision is float32: 'float32' (HIGHEST) and 'tf32'
  give the same logits and gradients, bit for bit."""
  results = []
  for precision in ("float32", "tf32"):
    model = _model(name, precision, **kw)
    params, x = _params(model, name), _inputs(name)
    y = jnp.arange(16) % model.num_classes
    loss = lambda p, m=model: train.cross_entropy(m.apply({"params": p}, x), y, jnp.ones(16))
    results.append((jax.jit(model.apply)({"params": params}, x),
                    jax.jit(jax.grad(loss))(params)))
  jax.tree.map(np.testing.assert_array_equal, *results)


def test_precision_record():
  assert [models.precision_record(p) for p in models.PRECISIONS] == [
      {"name": "float32", "matmul": "highest"}, {"name": "tf32", "matmul": "default"},
      {"name": "bf16", "matmul": "bfloat16"}]
  with pytest.raises(ValueError, match=r"unknown precision 'fp16'; expected one of float32, "
                                       r"tf32, bf16"):
    models.precision_record("fp16")
  config = fr.resolve("digits-personalized")
  assert config.record(cfg.sweep(config, {}))["precision"] == {
      "name": "float32", "matmul": "highest"}
  assert config.record(cfg.sweep(config, {"precision": ("float32", "bf16")}))["precision"] == [
      {"name": "float32", "matmul": "highest"}, {"name": "bf16", "matmul": "bfloat16"}]
  linear = fr.resolve("fedrep-fig3")
  assert linear.record(cfg.sweep(linear, {})) == {}


@pytest.mark.parametrize("name", MODELS)
def test_bf16_keeps_float32_params_and_outputs(name):
  """bf16: the same float32 params (flax's param_dtype) from the same key; the matmuls run
  in bfloat16; the features and logits come back float32."""
  model, plain = _model(name, "bf16"), _model(name)
  assert all(m.dtype == jnp.bfloat16 for m in _submodules(model))
  params = _params(model, name)
  assert _dtypes(params) == {jnp.dtype(jnp.float32)}
  jax.tree.map(np.testing.assert_array_equal, params, _params(plain, name))
  x = _inputs(name)
  logits = jax.jit(model.apply)({"params": params}, x)
  features = jax.jit(lambda p, x: model.apply({"params": p}, x, method=model.features))(
      params, x)
  assert logits.dtype == features.dtype == jnp.float32
  jaxpr = str(jax.make_jaxpr(model.apply)({"params": params}, x))
  assert re.search(r"bf16\[[\d,]*\] = dot_general", jaxpr)
  assert not re.search(r"f32\[[\d,]*\] = dot_general", jaxpr)  # no float32 matmul, head too


@pytest.mark.parametrize("name,kw", [
    ("digits-mlp", {}),
    ("cifar10-cnn", {"conv_impl": "im2col"}),
    pytest.param("cifar10-cnn", {"conv_impl": "xla"}, marks=pytest.mark.slow),
    pytest.param("sent140-lstm", {}, marks=pytest.mark.slow),
])  # the fast tier keeps the MLP and the im2col CNN
def test_bf16_logits_and_gradients_close_to_float32(name, kw):
  """bfloat16 has an 8-bit mantissa (relative rounding 2^-9): logits agree to about 1e-2
  of their scale, and the gradients point the same way."""
  model, plain = _model(name, "bf16", **kw), _model(name, **kw)
  params = _params(plain, name)
  x = _inputs(name, batch=32)
  with jax.default_matmul_precision("highest"):
    want = jax.jit(plain.apply)({"params": params}, x)
  got = jax.jit(model.apply)({"params": params}, x)
  np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * float(np.abs(want).max()))
  y = jnp.arange(32) % plain.num_classes

  def grads(m):
    loss = lambda p: train.cross_entropy(m.apply({"params": p}, x), y, jnp.ones(32))
    return jax.jit(jax.grad(loss))(params)

  got_grads, want_grads = grads(model), grads(plain)
  assert _dtypes(got_grads) == {jnp.dtype(jnp.float32)}
  a, b = (jnp.concatenate([g.ravel() for g in jax.tree.leaves(t)])
          for t in (got_grads, want_grads))
  assert float(a @ b / (jnp.linalg.norm(a) * jnp.linalg.norm(b))) > 0.99


def test_unknown_precision_is_a_value_error():
  with pytest.raises(ValueError, match=r"unknown precision 'fp16'; expected one of float32, "
                                       r"tf32, bf16"):
    models.make_model("digits-mlp", precision="fp16")


@pytest.mark.slow  # the fast tier keeps bf16 logits and gradients against float32
def test_fedrep_round_with_bf16_keeps_float32_state():
  """One FedRep round and an evaluation with a bf16 model: training runs bfloat16 matmuls,
  the state (shared and personal params) and the SGD momentum stay float32, and the
  metrics are finite."""
  model = models.make_model("digits-mlp", 10, precision="bf16")
  data = jax.tree.map(lambda a: a[:6], fr.digits.federated(40, "classes", 2, seed=0))
  hparams = fr.nn_hparams(lr=0.05, momentum=0.5, weight_decay=1e-4)
  algorithm = fr.make_neural_algorithm("fedrep", model=model, cohort=3, local_epochs=1,
                                       head_epochs=2, batch_size=4, client_group=2)
  state = algorithm.init(jax.random.key(0), data, hparams)
  assert jax.tree.map(lambda a: a.dtype, (state.shared, state.personal)) == jax.tree.map(
      lambda a: jnp.dtype(jnp.float32), (state.shared, state.personal))
  round_fn = jax.jit(algorithm.round)
  assert "bf16" in str(jax.make_jaxpr(algorithm.round)(state, jax.random.key(1), data, hparams))
  new, metrics = round_fn(state, jax.random.key(1), data, hparams)
  assert _dtypes((new.shared, new.personal)) == {jnp.dtype(jnp.float32)}
  assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(metrics))
  assert not jax.tree.all(jax.tree.map(np.array_equal, state.shared, new.shared))
  evaluation = jax.jit(algorithm.evaluate)(new, data, hparams)
  assert all(np.all(np.isfinite(v)) for v in jax.tree.leaves(evaluation))

  # The optimiser's momentum of the float32 params, from the bf16 model's gradients.
  flat = params_lib.flatten(_params(model, "digits-mlp"))
  loss = lambda p: train.cross_entropy(algorithm.logits(p, data.x[0]), data.y[0],
                                       jnp.ones(data.y.shape[1]))
  optimizer = train.optimizer(hparams)
  opt_state = optimizer.init(flat)
  updates, opt_state = optimizer.update(jax.grad(loss)(flat), opt_state, flat)
  assert _dtypes((updates, opt_state)) == {jnp.dtype(jnp.float32)}


def test_precision_setting_of_every_neural_recipe(compiles):
  """Every recipe that builds a model has `precision` (default float32, choices among the
  models', float32 and bf16 among them, the same for every recipe); bf16 is accepted and
  recorded in the config (config.json is its asdict); a bad value is a ConfigError naming
  the key and the choices, before any compilation."""
  choices = cfg.fields(neural.Training)["precision"].metadata["check"].choices
  assert {"float32", "bf16"} <= set(choices) <= set(models.PRECISIONS)
  for recipe in NEURAL_RECIPES:
    field = cfg.fields(recipe_registry.get(recipe).config)["precision"]
    assert field.default == "float32"
    assert field.metadata["check"].choices == choices
  config = fr.resolve("digits-personalized", overrides=["precision=bf16"])
  assert config.precision == "bf16" and dataclasses.asdict(config)["precision"] == "bf16"
  assert fr.resolve("digits-personalized").precision == "float32"
  with pytest.raises(fr.ConfigError, match=r"precision='fp16' is out of range: precision "
                                           r"must be one of " + ", ".join(choices)):
    fr.resolve("digits-personalized", overrides=["precision=fp16"])
  with pytest.raises(fr.ConfigError, match=r"precision='half' is out of range.*float32.*bf16"):
    fr.resolve("fedavg-ft-neural", overrides=["precision=half"])
  assert compiles.count == 0


@pytest.mark.slow
def test_digits_recipe_trains_in_bf16_and_records_it(tmp_path):
  """A short bf16 digits-personalized run (FedRep, 10 rounds, one seed) learns and writes
  precision into config.json (the setting, and what ran: bfloat16 matmuls)."""
  out = str(tmp_path / "run")
  args = ["run", "digits-personalized", "--seeds", "1", "--out", out, "--no-progress",
          "--set", "precision=bf16", "--set", "algorithms=fedrep", "--set", "rounds=10"]
  assert cli.main(args) == 0
  with open(os.path.join(out, "config.json")) as f:
    saved = json.load(f)
  assert saved["config"]["precision"] == "bf16"
  assert saved["precision"] == {"name": "bf16", "matmul": "bfloat16"}
  with open(os.path.join(out, "metrics.csv")) as f:
    accuracy = [float(r["test_accuracy"]) for r in csv.DictReader(f) if r["test_accuracy"]]
  assert len(accuracy) == 2 and np.isfinite(accuracy).all()  # rounds 5 and 10
  assert accuracy[-1] > 0.5  # chance: 0.1
