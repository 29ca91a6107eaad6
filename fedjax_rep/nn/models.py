"""Image classifiers split into a shared `body` (feature extractor) and a linear `head`.

Every model is a `Classifier`, so `params == {'body': {...}, 'head': {'kernel', 'bias'}}`
and representation-learning methods (FedRep, FedAvg+FT, ...) can treat the two parts
separately. Body layers are named conv1, conv2, ..., fc1, fc2, ... so that sorting their names
gives the network order. The CIFAR and MLP architectures follow FedRep's authors' code.
"""

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_rep.nn.conv import Conv, max_pool2


class Body(nn.Module):
  """Feature extractor [..., H, W, C] -> [..., fcs[-1]].

  Each entry of `convs` is a VALID kernel_size x kernel_size conv (named conv1, conv2, ...)
  followed by ReLU and a 2x2 max pool; then the last three axes are flattened and each entry
  of `fcs` is a dense layer (fc1, fc2, ...) followed by ReLU. With no convs it is an MLP.
  """
  convs: Sequence[int]
  fcs: Sequence[int]
  kernel_size: int = 5
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    k = self.kernel_size
    for i, features in enumerate(self.convs):
      x = max_pool2(nn.relu(Conv(features, (k, k), self.conv_impl, name=f"conv{i + 1}")(x)))
    x = x.reshape(*x.shape[:-3], -1)
    for i, features in enumerate(self.fcs):
      x = nn.relu(nn.Dense(features, name=f"fc{i + 1}")(x))
    return x


class Classifier(nn.Module):
  """Logits [..., num_classes] = head(dropout(body(x))); dropout only when training.

  Use `method=model.features` for the body output h [..., F] and `method=model.logits` to
  apply the head to given features; training dropout draws from the 'dropout' rng stream.
  """
  body: nn.Module
  num_classes: int
  dropout: float = 0.0

  def setup(self):
    self.head = nn.Dense(self.num_classes)
    self.drop = nn.Dropout(self.dropout)

  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    """Logits [..., num_classes] of inputs x [..., H, W, C]."""
    return self.logits(self.features(x), train)

  def features(self, x: jax.Array) -> jax.Array:
    """Body output [..., F] of inputs x [..., H, W, C] (deterministic)."""
    return self.body(x)

  def logits(self, h: jax.Array, train: bool = False) -> jax.Array:
    """Head output [..., num_classes] of features h [..., F], with dropout on h if train."""
    return self.head(self.drop(h, deterministic=not train))


# name -> (Body fields, default num_classes, dropout rate before the head)
_SPECS = {
    "cifar10-cnn": (dict(convs=(64, 64), fcs=(120, 64)), 10, 0.0),
    "cifar100-cnn": (dict(convs=(64, 128), fcs=(256, 128)), 100, 0.6),
    "mlp": (dict(convs=(), fcs=(512, 256, 64)), 10, 0.0),
    "digits-mlp": (dict(convs=(), fcs=(64, 32)), 10, 0.0),
    "digits-cnn": (dict(convs=(16,), fcs=(64,), kernel_size=3), 10, 0.0),
}

MODELS: dict[str, str] = {
    "cifar10-cnn": "32x32x3: conv 64, pool, conv 64, pool, fc 1600->120->64, head 64->10",
    "cifar100-cnn": ("32x32x3: conv 64, pool, conv 128, pool, fc 3200->256->128, "
                     "dropout 0.6, head 128->100"),
    "mlp": "28x28x1 (EMNIST/FEMNIST): fc 784->512->256->64, head 64->10",
    "digits-mlp": "8x8x1 digits: fc 64->64->32, head 32->10",
    "digits-cnn": "8x8x1 digits: conv 16 3x3, pool, fc 144->64, head 64->10",
}


def make_model(name: str, num_classes: int | None = None,
               conv_impl: str = "auto") -> Classifier:
  """The `Classifier` registered as `name`; num_classes (if given) overrides its default."""
  if name not in _SPECS:
    raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
  fields, default_classes, dropout = _SPECS[name]
  return Classifier(Body(**fields, conv_impl=conv_impl),
                    default_classes if num_classes is None else num_classes, dropout)


def init_params(model: nn.Module, key: jax.Array, input_shape: Sequence[int]):
  """Initial params of `model` for one example of shape input_shape (no batch axis)."""
  return jax.jit(model.init)(key, jnp.zeros((1, *input_shape), jnp.float32))["params"]
