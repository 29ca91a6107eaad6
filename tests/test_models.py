import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.conv import Conv, max_pool2, resolve_impl
from fedjax_rep.nn.models import MODELS, Body, init_params, make_model

RTOL, ATOL = 1e-5, 1e-5

INPUTS = {
    "cifar10-cnn": (32, 32, 3),
    "cifar100-cnn": (32, 32, 3),
    "mlp": (28, 28, 1),
    "digits-mlp": (8, 8, 1),
    "digits-cnn": (8, 8, 1),
    "synthetic-mlp": (60,),
    "sent140-lstm": (8,),
}
NUM_CLASSES = {"cifar10-cnn": 10, "cifar100-cnn": 100, "mlp": 10, "digits-mlp": 10,
               "digits-cnn": 10, "synthetic-mlp": 10}
BODY_LAYERS = {
    "cifar10-cnn": ["conv1", "conv2", "fc1", "fc2"],
    "cifar100-cnn": ["conv1", "conv2", "fc1", "fc2"],
    "mlp": ["fc1", "fc2", "fc3"],
    "digits-mlp": ["fc1", "fc2"],
    "digits-cnn": ["conv1", "fc1"],
    "synthetic-mlp": ["fc1", "fc2"],
}
VOCAB, SEQ, HIDDEN = 20, INPUTS["sent140-lstm"][0], 100


@pytest.fixture(autouse=True)
def _full_precision():
  """float32 dots and convs everywhere (GPUs may default to TF32, far from rtol 1e-5)."""
  with jax.default_matmul_precision("highest"):
    yield


def _normal(seed, shape):
  """Standard normal float32 test data (numpy: no per-op XLA compiles)."""
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv_params(seed, kh, kw, cin, cout):
  return {"kernel": _normal(seed, (kh, kw, cin, cout)) / np.sqrt(kh * kw * cin),
          "bias": _normal(seed + 1, (cout,))}


def _conv_value_and_grads(impl, kernel_size, cot):
  """Jitted (output, (d/dparams, d/dx) of <output, cot>) of a 6-feature Conv."""
  conv = Conv(6, kernel_size, impl)

  def f(p, x):
    y, vjp = jax.vjp(lambda p, x: conv.apply({"params": p}, x), p, x)
    return y, vjp(cot)
  return jax.jit(f)


@pytest.mark.parametrize("batch,kernel_size", [((4,), (5, 5)), ((2, 3), (3, 2)), ((), (3, 3))])
def test_im2col_matches_xla(batch, kernel_size):
  x = _normal(0, (*batch, 9, 8, 3))
  params = _conv_params(1, *kernel_size, 3, 6)
  cot = _normal(3, (*batch, 10 - kernel_size[0], 9 - kernel_size[1], 6))
  y, grads = _conv_value_and_grads("im2col", kernel_size, cot)(params, x)
  assert y.shape == cot.shape
  chex.assert_trees_all_close((y, grads),
                              _conv_value_and_grads("xla", kernel_size, cot)(params, x),
                              rtol=RTOL, atol=ATOL)


def test_im2col_matches_xla_vmapped_over_client_kernels():
  clients = 3
  x = _normal(0, (clients, 5, 10, 10, 2))
  params = jax.tree.map(lambda *a: np.stack(a),
                        *[_conv_params(2 * c + 1, 5, 5, 2, 4) for c in range(clients)])

  def per_client(impl):
    def loss(p, x):
      return jnp.sum(jnp.sin(Conv(4, (5, 5), impl).apply({"params": p}, x)))
    return jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1))))

  chex.assert_trees_all_close(per_client("im2col")(params, x), per_client("xla")(params, x),
                              rtol=RTOL, atol=ATOL)


def test_conv_params_and_impls():
  p = jax.eval_shape(Conv(7, (3, 3)).init, jax.random.key(0), jnp.zeros((1, 6, 6, 2)))["params"]
  assert jax.tree.map(jnp.shape, p) == {"kernel": (3, 3, 2, 7), "bias": (7,)}
  assert resolve_impl("auto") == ("xla" if jax.default_backend() in ("gpu", "tpu")
                                  else "im2col")
  with pytest.raises(ValueError, match="impl"):
    resolve_impl("fft")


def test_max_pool2_matches_flax():
  x = _normal(0, (3, 8, 6, 5))

  @jax.jit
  def value_and_grad(x):
    return [jax.value_and_grad(lambda x: jnp.sum(jnp.cos(pool(x))))(x)
            for pool in (max_pool2, lambda x: nn.max_pool(x, (2, 2), strides=(2, 2)))]

  chex.assert_trees_all_close(*value_and_grad(x), rtol=RTOL, atol=ATOL)
  chex.assert_trees_all_close(jax.jit(max_pool2)(x), nn.max_pool(x, (2, 2), strides=(2, 2)),
                              rtol=RTOL, atol=ATOL)
  assert jax.eval_shape(max_pool2, jnp.zeros((2, 4, 8, 6, 5))).shape == (2, 4, 4, 3, 5)
  with pytest.raises(ValueError, match="even"):
    max_pool2(jnp.zeros((1, 5, 4, 1)))


def test_registry():
  assert set(MODELS) == set(INPUTS)
  with pytest.raises(ValueError, match="cifar10-cnn"):
    make_model("resnet", 10)
  model = make_model("mlp", 62)
  p = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 28, 28, 1)))["params"]
  assert p["head"]["kernel"].shape == (64, 62)


def _random_params(model, input_shape):
  """Params of init_params' shapes, drawn in numpy with fan-in scaling (compiling the
  truncated-normal init of every model would dominate this file's time)."""
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, *input_shape)))
  return jax.tree.map(lambda s: _normal(0, s.shape) / np.sqrt(np.prod(s.shape[:-1] or [1])),
                      shapes["params"])


def test_init_params():
  model = make_model("digits-cnn")
  params = init_params(model, jax.random.key(0), (8, 8, 1))
  chex.assert_trees_all_equal_shapes(params, _random_params(model, (8, 8, 1)))
  assert not np.any(params["head"]["bias"]) and np.std(params["body"]["fc1"]["kernel"]) > 0


@pytest.fixture(scope="module", params=list(NUM_CLASSES))
def model_and_params(request):
  name = request.param
  model = make_model(name)
  return name, model, _random_params(model, INPUTS[name])


def test_param_structure(model_and_params):
  name, model, params = model_and_params
  assert set(params) == {"body", "head"}
  assert set(params["head"]) == {"kernel", "bias"}
  assert sorted(params["body"]) == BODY_LAYERS[name]
  assert params["head"]["bias"].shape == (NUM_CLASSES[name],)
  expected = {
      "cifar10-cnn": {"conv1": (5, 5, 3, 64), "conv2": (5, 5, 64, 64), "fc1": (1600, 120),
                      "fc2": (120, 64)},
      "cifar100-cnn": {"conv1": (5, 5, 3, 64), "conv2": (5, 5, 64, 128), "fc1": (3200, 256),
                       "fc2": (256, 128)},
      "mlp": {"fc1": (784, 512), "fc2": (512, 256), "fc3": (256, 64)},
      "digits-cnn": {"conv1": (3, 3, 1, 16), "fc1": (144, 64)},
      "synthetic-mlp": {"fc1": (60, 64), "fc2": (64, 32)},
  }.get(name)
  if expected is not None:
    assert {k: v["kernel"].shape for k, v in params["body"].items()} == expected
  last = BODY_LAYERS[name][-1]
  assert params["head"]["kernel"].shape == (params["body"][last]["bias"].shape[0],
                                            NUM_CLASSES[name])


def test_features_logits_and_dropout(model_and_params):
  name, model, params = model_and_params
  x = _normal(0, (2, 3, *INPUTS[name]))
  rngs = {"dropout": jax.random.key(4)}

  @jax.jit
  def outputs(params, x):
    variables = {"params": params}
    h = model.apply(variables, x, method=model.features)
    return (model.apply(variables, x), h, model.apply(variables, h, method=model.logits),
            model.apply(variables, x, train=True, rngs=rngs),
            model.apply(variables, h, train=True, method=model.logits, rngs=rngs))

  logits, h, head_logits, trained, head_trained = outputs(params, x)
  width = params["head"]["kernel"].shape[0]
  assert logits.shape == (2, 3, NUM_CLASSES[name]) and h.shape == (2, 3, width)
  chex.assert_trees_all_close((head_logits, head_trained), (logits, trained), rtol=RTOL,
                              atol=ATOL)
  if model.dropout > 0:
    assert not np.allclose(trained, logits)
  else:
    chex.assert_trees_all_close(trained, logits, rtol=RTOL, atol=ATOL)


def test_conv_impls_agree_in_model():
  x = _normal(0, (4, 8, 8, 1))
  y = _normal(1, (4, 10))
  models = [make_model("digits-cnn", conv_impl=impl) for impl in ("im2col", "xla")]
  params = _random_params(models[0], (8, 8, 1))
  grads = [jax.jit(jax.grad(lambda p: jnp.sum(m.apply({"params": p}, x) * y)))(params)
           for m in models]
  chex.assert_trees_all_close(*grads, rtol=RTOL, atol=ATOL)


def test_synthetic_mlp_on_vectors():
  model = make_model("synthetic-mlp")
  params = init_params(model, jax.random.key(0), (60,))
  x = _normal(0, (5, 60))
  h = model.apply({"params": params}, x, method=model.features)
  assert h.shape == (5, 32) and model.apply({"params": params}, x).shape == (5, 10)
  with pytest.raises(ValueError, match="example_axes"):
    Body(convs=(4,), fcs=(), example_axes=1).init(jax.random.key(0), jnp.zeros((1, 6)))


# -- Sent140 LSTM ----------------------------------------------------------------------------


def _tokens(seed, lengths, seq=SEQ):
  """Token ids [len(lengths), seq]: random real tokens (1..VOCAB-1), right-padded with 0."""
  x = np.random.default_rng(seed).integers(1, VOCAB, (len(lengths), seq)).astype(np.int32)
  x[np.arange(seq) >= np.array(lengths)[:, None]] = 0
  return x


LENGTHS = [8, 3, 1, 0, 5]


@pytest.fixture(scope="module")
def lstm():
  """(model, params with random biases, jitted (features, logits) of (params, tokens))."""
  model = make_model("sent140-lstm", vocab_size=VOCAB)
  params = init_params(model, jax.random.key(0), (SEQ,))
  for i, layer in enumerate(("lstm1", "lstm2")):
    params["body"][layer]["bias"] = _normal(i, (4 * HIDDEN,))
  params["head"]["bias"] = _normal(2, (2,))

  @jax.jit
  def outputs(params, x):
    return (model.apply({"params": params}, x, method=model.features),
            model.apply({"params": params}, x))
  return model, params, outputs


@pytest.mark.slow
def test_lstm_shapes_and_layers(lstm):
  model, params, outputs = lstm
  h, logits = jax.tree.map(np.asarray, outputs(params, _tokens(0, LENGTHS)))
  assert h.shape == (5, HIDDEN) and logits.shape == (5, 2)
  assert not np.any(h[3]) and np.all(np.abs(h[[0, 1, 2, 4]]).max(-1) > 0)
  h, logits = outputs(params, _tokens(0, LENGTHS * 2).reshape(2, 5, SEQ))
  assert h.shape == (2, 5, HIDDEN) and logits.shape == (2, 5, 2)
  flat = params_lib.flatten(params)
  assert params_lib.layers(flat) == ["body/embed", "body/lstm1", "body/lstm2", "head"]
  assert {k: v.shape for k, v in flat.items() if k.startswith("body/lstm1")} == {
      "body/lstm1/kernel_i": (50, 4 * HIDDEN), "body/lstm1/kernel_h": (HIDDEN, 4 * HIDDEN),
      "body/lstm1/bias": (4 * HIDDEN,)}
  shared = {p for p, label in params_lib.last_layers_shared(2)(flat).items()
            if label == params_lib.SHARED}
  assert shared == {p for p in flat if p.startswith(("body/lstm2/", "head/"))}
  assert model.input_dtype == jnp.int32


@pytest.mark.slow
def test_lstm_ignores_padding(lstm):
  _, params, outputs = lstm
  x = _tokens(0, LENGTHS)
  h, logits = jax.tree.map(np.asarray, outputs(params, x))
  # same shapes: exactly equal when the padding embedding or other rows change
  other = {**params, "body": {**params["body"], "embed": {
      "embedding": params["body"]["embed"]["embedding"].at[0].set(5.0)}}}
  for got in (outputs(other, x), outputs(params, np.where(np.arange(5)[:, None] == 1, 0, x))):
    kept = np.array([0, 2, 3, 4])
    chex.assert_trees_all_equal(jax.tree.map(lambda a: a[kept], got), (h[kept], logits[kept]))
  # other lengths: equal up to rounding (other shapes may take other matmul kernels)
  longer = outputs(params, np.pad(x, ((0, 0), (0, 4))))
  chex.assert_trees_all_close(longer, (h, logits), rtol=RTOL, atol=ATOL)
  for i, length in enumerate(LENGTHS):
    if length:
      chex.assert_trees_all_close(outputs(params, x[i:i + 1, :length]),
                                  (h[i:i + 1], logits[i:i + 1]), rtol=RTOL, atol=ATOL)


def _flax_cell_params(layer):
  """nn.LSTMCell params of an LSTM layer's {kernel_i, kernel_h, bias} (gates i, f, g, o)."""
  split = lambda a: np.split(np.asarray(a), 4, axis=-1)
  cell = {f"i{g}": {"kernel": k} for g, k in zip("ifgo", split(layer["kernel_i"]))}
  cell.update({f"h{g}": {"kernel": k, "bias": b}
               for g, k, b in zip("ifgo", split(layer["kernel_h"]), split(layer["bias"]))})
  return cell


def test_lstm_matches_flax_cells(lstm):
  _, params, outputs = lstm
  x = _tokens(1, [8, 3, 1, 5, 7])
  lengths = np.count_nonzero(x, axis=-1)
  h = np.asarray(params["body"]["embed"]["embedding"])[x]
  rnn = nn.RNN(nn.LSTMCell(HIDDEN))
  for layer in ("lstm1", "lstm2"):
    carry, h = rnn.apply({"params": {"cell": _flax_cell_params(params["body"][layer])}}, h,
                         seq_lengths=lengths, return_carry=True)
  chex.assert_trees_all_close(outputs(params, x)[0], carry[1], rtol=RTOL, atol=ATOL)


def test_lstm_padding_rows_and_gradients_finite(lstm):
  model, params, _ = lstm
  y = _normal(3, (2, 5, 2))

  @jax.jit
  def value_and_grad(params, x):
    return jax.value_and_grad(lambda p: jnp.sum(model.apply({"params": p}, x) * y))(params)

  for x in (_tokens(0, LENGTHS * 2).reshape(2, 5, SEQ), np.zeros((2, 5, SEQ), np.int32)):
    value, grads = value_and_grad(params, x)
    chex.assert_tree_all_finite((value, grads))
  assert not np.any(grads["body"]["lstm1"]["kernel_i"])  # padding only: no path to the body


@pytest.mark.slow
def test_lstm_glove_init_and_options():
  table = _normal(0, (VOCAB, 7))
  model = make_model("sent140-lstm", vocab_size=VOCAB, embeddings=table)
  hash(model)
  params = init_params(model, jax.random.key(0), (SEQ,))
  np.testing.assert_array_equal(params["body"]["embed"]["embedding"], table)
  assert params["body"]["lstm1"]["kernel_i"].shape == (7, 4 * HIDDEN)
  x = _tokens(0, [4, 2])
  grad = jax.grad(lambda p: jnp.sum(model.apply({"params": p}, x, method=model.features)))(
      params)["body"]["embed"]["embedding"]
  used = np.isin(np.arange(VOCAB), x[x != 0])
  assert np.all(np.abs(grad[used]).max(-1) > 0) and not np.any(grad[~used])
  assert make_model("sent140-lstm", embeddings=table).body.vocab_size == VOCAB
  with pytest.raises(ValueError, match="vocab_size"):
    make_model("sent140-lstm")
  with pytest.raises(ValueError, match="embeddings"):
    make_model("sent140-lstm", vocab_size=VOCAB + 1, embeddings=table)
  with pytest.raises(ValueError, match="embeddings"):
    make_model("sent140-lstm", embeddings=table[0])
  with pytest.raises(ValueError, match="token models"):
    make_model("mlp", vocab_size=VOCAB)


def test_lstm_vmapped_over_clients(lstm):
  model, params, outputs = lstm
  clients = [jax.tree.map(lambda a, c=c: a * (1 + 0.1 * c), params) for c in range(3)]
  x = _tokens(0, LENGTHS * 3).reshape(3, 5, SEQ)
  stacked = jax.tree.map(lambda *a: np.stack(a), *clients)
  per_client = jax.jit(jax.vmap(outputs))(stacked, x)
  for c in range(3):
    chex.assert_trees_all_close(jax.tree.map(lambda a, c=c: a[c], per_client),
                                outputs(clients[c], x[c]), rtol=RTOL, atol=ATOL)
  shared = jax.jit(jax.vmap(outputs, in_axes=(None, 0)))(params, x)
  chex.assert_trees_all_close(shared, outputs(params, x), rtol=RTOL, atol=ATOL)
