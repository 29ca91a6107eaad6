"""Classifiers split into a shared `body` (feature extractor) and a linear `head`.

Every model is a `Classifier`: `params == {'body': {...}, 'head': {'kernel', 'bias'}}`.
Each body layer keeps its params directly under one name, and the names sort in network
order (conv1, conv2, ..., fc1, fc2, ...; embed, lstm1, lstm2), so `params.layers` lists the
layers in order. The CIFAR, MLP and Sent140 LSTM architectures follow FedRep's authors'
code.

Precision (`make_model(..., precision=...)`): 'float32' (the default) runs every matmul and
conv, and so its gradient's, at `jax.lax.Precision.HIGHEST`: float32 on every backend; 'tf32'
at jax's default matmul precision (TF32 on NVIDIA GPUs that have it, float32 on the CPU);
'bf16' is mixed precision through flax's `dtype` (`param_dtype` float32): each layer casts its
inputs and params to bfloat16, but the embedding is looked up in float32 (its rows cast) and
the LSTM's carry (c, h) stays float32, as in flax's LSTMCell. `features` and the logits are
float32, and so are the loss, the gradients and the optimiser state.
"""

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.dtypes import promote_dtype

from fedjax_rep.nn.conv import Conv, max_pool2


class Body(nn.Module):
  """Feature extractor [..., *example] -> [..., fcs[-1]], where an example has
  `example_axes` axes: 3 for images [H, W, C], 1 for vectors [D].

  Each entry of `convs` (images only) is a VALID kernel_size x kernel_size conv (named conv1,
  conv2, ...) followed by ReLU and a 2x2 max pool; then the example's axes are flattened and
  each entry of `fcs` is a dense layer (fc1, fc2, ...) followed by ReLU. With no convs it is
  an MLP. `dtype` is the layers' computation dtype (None: float32, the params' dtype;
  jnp.bfloat16: bfloat16 activations and output from float32 inputs and params), and
  `precision` their matmuls' and convs' `jax.lax.Precision` (None: jax's default).
  """
  input_dtype: ClassVar[Any] = jnp.float32
  convs: Sequence[int]
  fcs: Sequence[int]
  kernel_size: int = 5
  conv_impl: str = "auto"
  example_axes: int = 3
  dtype: Any = None
  precision: Any = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.convs and self.example_axes != 3:
      raise ValueError(f"convs need image examples (example_axes 3), not {self.example_axes}")
    k = self.kernel_size
    for i, features in enumerate(self.convs):
      conv = Conv(features, (k, k), self.conv_impl, self.dtype, self.precision,
                  name=f"conv{i + 1}")
      x = max_pool2(nn.relu(conv(x)))
    lead = x.ndim - self.example_axes  # the example's size, not -1: batches may be empty
    x = x.reshape(*x.shape[:lead], int(np.prod(x.shape[lead:])))
    for i, features in enumerate(self.fcs):
      x = nn.relu(nn.Dense(features, dtype=self.dtype, precision=self.precision,
                           name=f"fc{i + 1}")(x))
    return x


def _stacked_orthogonal(key: jax.Array, shape: Sequence[int], dtype=jnp.float32) -> jax.Array:
  """[H, 4H]: four independent orthogonal [H, H] blocks side by side (one per gate)."""
  hidden = shape[0]
  blocks = [nn.initializers.orthogonal()(k, (hidden, hidden), dtype)
            for k in jax.random.split(key, 4)]
  return jnp.concatenate(blocks, axis=-1)


class LSTM(nn.Module):
  """One LSTM layer over sequences x [..., L, E] -> hidden states [..., L, features], from
  zero state. Same cell and init as flax's `nn.LSTMCell` (gates i, f, g, o), but its params
  are three arrays directly under the layer's name -- kernel_i [E, 4H], kernel_h [H, 4H],
  bias [4H] -- so that the layer is one entry of `params.layers`. The input projection of
  all steps is one matmul before the recurrence. `dtype` is the computation dtype of the
  matmuls and gates (None: float32); the params and the recurrent state (c, h), and so the
  output, stay float32, as in flax's LSTMCell with `dtype` set. `precision` is the matmuls'
  `jax.lax.Precision` (None: jax's default).
  """
  features: int
  dtype: Any = None
  precision: Any = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    hidden = self.features
    kernel_i = self.param("kernel_i", nn.initializers.lecun_normal(), (x.shape[-1], 4 * hidden))
    kernel_h = self.param("kernel_h", _stacked_orthogonal, (hidden, 4 * hidden))
    bias = self.param("bias", nn.initializers.zeros_init(), (4 * hidden,))
    state_dtype = kernel_h.dtype  # float32, the params' dtype
    if self.dtype is not None:
      x, kernel_i, kernel_h, bias = promote_dtype(x, kernel_i, kernel_h, bias, dtype=self.dtype)

    def step(carry, gates_x):
      c, h = carry
      if self.dtype is not None:
        h = h.astype(self.dtype)
      i, f, g, o = jnp.split(gates_x + jnp.matmul(h, kernel_h, precision=self.precision), 4,
                             axis=-1)
      c = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
      h = nn.sigmoid(o) * jnp.tanh(c)
      return (c, h), h

    gates_x = jnp.moveaxis(jnp.matmul(x, kernel_i, precision=self.precision) + bias, -2,
                           0)  # [L, ..., 4H]
    zeros = jnp.zeros((*x.shape[:-2], hidden), state_dtype)
    _, hs = jax.lax.scan(step, (zeros, zeros), gates_x)
    return jnp.moveaxis(hs, 0, -2)


class LSTMBody(nn.Module):
  """Feature extractor of token sequences [..., L] -> [..., hidden] (FedRep's Sent140 model
  minus its head): embedding `embed` [vocab_size, embed_dim], then `len(lstms)` LSTM layers
  lstm1, lstm2, ...; the features are the top layer's hidden state at each sequence's last
  real token.

  Token 0 is padding and sequences are right-padded: a sequence's length is 1 + the index of
  its last nonzero token, and its features do not depend on anything after it. A sequence of
  padding only has zero features. Inputs of any dtype are cast to int32. `dtype` is the
  computation dtype (None: float32): the float32 embedding's rows are cast to it and the
  LSTM layers compute in it (their state and output stay float32, see `LSTM`), their
  matmuls at `precision` (a `jax.lax.Precision`; None: jax's default).
  """
  input_dtype: ClassVar[Any] = jnp.int32
  vocab_size: int
  embed_dim: int = 50
  lstms: Sequence[int] = (100, 100)
  embed_init: Callable[..., jax.Array] = nn.linear.default_embed_init
  dtype: Any = None
  precision: Any = None

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    tokens = x.astype(jnp.int32)
    positions = jnp.arange(1, tokens.shape[-1] + 1)
    lengths = jnp.max(jnp.where(tokens != 0, positions, 0), axis=-1)  # [...]
    h = nn.Embed(self.vocab_size, self.embed_dim, embedding_init=self.embed_init,
                 name="embed")(tokens)
    if self.dtype is not None:
      h = h.astype(self.dtype)  # gathered in float32: the table's gradient sums in float32
    for i, features in enumerate(self.lstms):
      h = LSTM(features, self.dtype, self.precision, name=f"lstm{i + 1}")(h)
    last = jnp.take_along_axis(h, jnp.maximum(lengths - 1, 0)[..., None, None], axis=-2)
    return jnp.where(lengths[..., None] > 0, last[..., 0, :], 0.0)


class Classifier(nn.Module):
  """Logits [..., num_classes] = head(dropout(body(x))); dropout only when training.

  Use `method=model.features` for the body output h [..., F] and `method=model.logits` to
  apply the head to given features; training dropout draws from the 'dropout' rng stream.

  `dtype` is the head's computation dtype (None: float32; `make_model` gives the body the
  same). Whatever it is, the params are float32 and `features` and the logits are returned
  in float32: with jnp.bfloat16 the body and head compute in bfloat16 and their outputs
  are cast up, so losses and their gradients with respect to the params are float32.
  `precision` is the head's `jax.lax.Precision` (None: jax's default; `make_model` gives
  the body the same).
  """
  body: nn.Module
  num_classes: int
  dropout: float = 0.0
  dtype: Any = None
  precision: Any = None

  def setup(self):
    self.head = nn.Dense(self.num_classes, dtype=self.dtype, precision=self.precision)
    self.drop = nn.Dropout(self.dropout)

  @property
  def input_dtype(self):
    """The dtype of the body's inputs (float32; int32 for token sequences)."""
    return self.body.input_dtype

  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """Logits [..., num_classes] of inputs x [..., *example]."""
    return self.logits(self.features(x), train)

  def features(self, x: jax.Array) -> jax.Array:
    """Body output [..., F] (float32) of inputs x [..., *example] (deterministic)."""
    return self._float32(self.body(x))

  def logits(self, h: jax.Array, train: bool = False) -> jax.Array:
    """Head output [..., num_classes] (float32) of features h [..., F], with dropout on h if
    train."""
    return self._float32(self.head(self.drop(h, deterministic=not train)))

  def _float32(self, y: jax.Array) -> jax.Array:
    """y cast to float32 where this model computes in another dtype (else y unchanged)."""
    return y if self.dtype is None else y.astype(jnp.float32)


# name -> (body class, its fields, default num_classes, dropout rate before the head)
_SPECS = {
    "cifar10-cnn": (Body, dict(convs=(64, 64), fcs=(120, 64)), 10, 0.0),
    "cifar100-cnn": (Body, dict(convs=(64, 128), fcs=(256, 128)), 100, 0.6),
    "mlp": (Body, dict(convs=(), fcs=(512, 256, 64)), 10, 0.0),
    "digits-mlp": (Body, dict(convs=(), fcs=(64, 32)), 10, 0.0),
    "digits-cnn": (Body, dict(convs=(16,), fcs=(64,), kernel_size=3), 10, 0.0),
    "synthetic-mlp": (Body, dict(convs=(), fcs=(64, 32), example_axes=1), 10, 0.0),
    "sent140-lstm": (LSTMBody, dict(embed_dim=50, lstms=(100, 100)), 2, 0.0),
}

MODELS: dict[str, str] = {
    "cifar10-cnn": "32x32x3: conv 64, pool, conv 64, pool, fc 1600->120->64, head 64->10",
    "cifar100-cnn": ("32x32x3: conv 64, pool, conv 128, pool, fc 3200->256->128, "
                     "dropout 0.6, head 128->100"),
    "mlp": "28x28x1 (EMNIST/FEMNIST): fc 784->512->256->64, head 64->10",
    "digits-mlp": "8x8x1 digits: fc 64->64->32, head 32->10",
    "digits-cnn": "8x8x1 digits: conv 16 3x3, pool, fc 144->64, head 64->10",
    "synthetic-mlp": "60-vectors (LEAF Synthetic): fc 60->64->32, head 32->10",
    "sent140-lstm": ("token ids [L] (Sent140, 0 = padding): embed 50 (or GloVe), "
                     "LSTM 100, LSTM 100, last real token, head 100->2"),
}


# The input shapes (one example) whose model `model_for` names, the package's datasets'.
BY_SHAPE = {(32, 32, 3): "cifar10-cnn", (28, 28, 1): "mlp", (8, 8, 1): "digits-mlp"}


def model_for(input_shape: Sequence[int]) -> str:
  """The name of the model for inputs of shape input_shape (one example): BY_SHAPE's, else
  "mlp" for other images [H, W, C] and "synthetic-mlp" for vectors [D]. Raises ValueError
  for other shapes, naming what to do."""
  shape = tuple(int(d) for d in input_shape)
  if shape in BY_SHAPE:
    return BY_SHAPE[shape]
  if len(shape) in (1, 3):
    return "mlp" if len(shape) == 3 else "synthetic-mlp"
  raise ValueError(f"no model is chosen for inputs of shape {shape}: give images [H, W, C] "
                   f"(e.g. [H, W, 1] for grey ones) or vectors [D], or name a model "
                   f"(one of {', '.join(MODELS)})")


PRECISIONS: dict[str, tuple[Any, Any]] = {
    "float32": (None, jax.lax.Precision.HIGHEST),
    "tf32": (None, None),
    "bf16": (jnp.bfloat16, None),
}
"""`make_model`'s precisions -> the modules' (computation dtype, matmul precision): dtype
None is float32; precision None is jax's default matmul precision (see the module
docstring)."""


def _precision(precision: str) -> tuple[Any, Any]:
  """PRECISIONS[precision]; ValueError naming the choices for an unknown one."""
  if precision not in PRECISIONS:
    raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
  return PRECISIONS[precision]


def precision_record(precision: str) -> dict:
  """What a run records of `make_model`'s `precision`: {"name": precision, "matmul": m},
  m the matmuls' arithmetic: 'highest' (float32 products on every backend), 'default'
  (jax's default matmul precision: TF32 on NVIDIA GPUs that have it) or 'bfloat16'."""
  dtype, matmul = _precision(precision)
  if dtype is not None:
    return {"name": precision, "matmul": jnp.dtype(dtype).name}
  return {"name": precision, "matmul": "default" if matmul is None else matmul.name.lower()}


def _table_init(table: np.ndarray) -> Callable[..., jax.Array]:
  """An initializer that returns `table` [V, E] (closed over, so that the model stays
  hashable; a jitted init embeds it as a constant)."""

  def init(key, shape, dtype=jnp.float32):
    del key
    if tuple(shape) != table.shape:
      raise ValueError(f"embedding of shape {tuple(shape)} cannot take a table {table.shape}")
    return jnp.asarray(table, dtype)

  return init


def _token_fields(vocab_size: int | None, embeddings) -> dict:
  """LSTMBody fields of the vocabulary options of `make_model`."""
  if embeddings is None:
    if vocab_size is None:
      raise ValueError("sent140-lstm needs vocab_size (or embeddings [vocab_size, E])")
    return dict(vocab_size=vocab_size)
  table = np.asarray(embeddings, np.float32)
  if table.ndim != 2 or vocab_size not in (None, table.shape[0]):
    raise ValueError(f"embeddings must be [vocab_size, E] with vocab_size {vocab_size}, "
                     f"got shape {table.shape}")
  return dict(vocab_size=table.shape[0], embed_dim=table.shape[1],
              embed_init=_table_init(table))


def make_model(name: str, num_classes: int | None = None, conv_impl: str = "auto", *,
               vocab_size: int | None = None, embeddings=None,
               precision: str = "float32") -> Classifier:
  """The `Classifier` registered as `name`.

  Args:
    name: one of MODELS.
    num_classes: the number of outputs; overrides the model's default if given.
    conv_impl: the convs' implementation (conv models): 'auto', 'im2col' or 'xla'.
    vocab_size: the token ids' range (sent140-lstm; required unless embeddings give it).
    embeddings: None (random, dimension 50) or a pretrained table [vocab_size, E] (e.g.
      GloVe) that initialises the (trainable) embedding of sent140-lstm.
    precision: one of PRECISIONS: 'float32' (everything in float32, every matmul and conv
      at `jax.lax.Precision.HIGHEST`), 'tf32' (float32, the matmuls and convs at jax's
      default precision: TF32 on NVIDIA GPUs that have it) or 'bf16' (mixed precision: the
      forward and backward passes of the body and head in bfloat16; params, gradients,
      logits and features in float32). See the module docstring.

  Returns:
    The Classifier (a flax module).

  Raises:
    ValueError: an unknown model or precision, or token options for a model without tokens.
  """
  if name not in _SPECS:
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
  dtype, matmul = _precision(precision)
  body_cls, fields, default_classes, dropout = _SPECS[name]
  if body_cls is LSTMBody:
    body = LSTMBody(**{**fields, **_token_fields(vocab_size, embeddings)}, dtype=dtype,
                    precision=matmul)
  elif vocab_size is not None or embeddings is not None:
    raise ValueError(f"vocab_size and embeddings are options of token models, not of {name!r}")
  else:
    body = Body(**fields, conv_impl=conv_impl, dtype=dtype, precision=matmul)
  return Classifier(body, default_classes if num_classes is None else num_classes, dropout,
                    dtype, matmul)


def init_params(model: Classifier, key: jax.Array, input_shape: Sequence[int], dtype=None):
  """Initial params of `model` for one example of shape input_shape (no batch axis) and
  dtype `dtype` (None: the model's `input_dtype`, int32 for token sequences)."""
  dtype = model.input_dtype if dtype is None else dtype
  return jax.jit(model.init)(key, jnp.zeros((1, *input_shape), dtype))["params"]
