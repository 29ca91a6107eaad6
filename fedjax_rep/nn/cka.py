"""How much each layer of a model changes: linear CKA (centred kernel alignment, Kornblith et
al., ICML 2019) between two models' layer outputs on the same inputs (FedAvg-FT paper, Fig. 2).

For features X [n, p] and Y [n, q] of the same n inputs, each column centred,

  CKA(X, Y) = ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F),

in [0, 1]: 1 when Y is X up to an orthogonal transform and an isotropic scaling, near 0 for
unrelated features. `layer_outputs` gives a model's layers' outputs (each conv or dense
layer's, before its activation, and the head's logits) from flax's captured intermediates.
"""

import jax
import jax.numpy as jnp

from fedjax_rep.nn import params as params_lib

HIGHEST = jax.lax.Precision.HIGHEST


def linear_cka(x: jax.Array, y: jax.Array) -> jax.Array:
  """Linear CKA [] of features x [n, p] and y [n, q] (rows: the same n inputs), their
  columns centred first. The products are formed on the cheaper side: the feature side
  (p x q matrices) or the input side (n x n Gram matrices, the same numbers since
  ||Y^T X||_F^2 = <X X^T, Y Y^T>_F), so a wide conv layer costs O(n^2 p). NaN where a side
  has no variance (all its centred features zero). float32 or wider; jittable."""
  x = x - jnp.mean(x, axis=0)
  y = y - jnp.mean(y, axis=0)
  n, p, q = x.shape[0], x.shape[1], y.shape[1]
  if n * n < p * q:  # the input side: Gram matrices [n, n]
    kx, ky = (jnp.matmul(a, a.T, precision=HIGHEST) for a in (x, y))
    cross, self_x, self_y = jnp.sum(kx * ky), jnp.linalg.norm(kx), jnp.linalg.norm(ky)
  else:
    cross = jnp.sum(jnp.square(jnp.matmul(y.T, x, precision=HIGHEST)))
    self_x = jnp.linalg.norm(jnp.matmul(x.T, x, precision=HIGHEST))
    self_y = jnp.linalg.norm(jnp.matmul(y.T, y, precision=HIGHEST))
  denominator = self_x * self_y
  return jnp.where(denominator > 0, cross / jnp.where(denominator > 0, denominator, 1.0),
                   jnp.nan)


def layers(flat: dict) -> list[str]:
  """The layers whose outputs `layer_outputs` gives, in network order: 'body/conv1', ...,
  'body/fc1', ..., 'head' (`params.layers`)."""
  return params_lib.layers(flat)


def layer_outputs(model, flat: dict, x: jax.Array) -> dict[str, jax.Array]:
  """{layer: its output [n, features] (float32)} of `model` (a `models.Classifier`) with
  flat params `flat` on inputs x [n, ...] (deterministic: no dropout), for every layer of
  `layers(flat)`: what the layer's module returns (a conv's or dense layer's output before
  its ReLU and pooling; the head's logits), each example's output flattened."""
  _, state = model.apply({"params": params_lib.unflatten(flat)}, x,
                         capture_intermediates=True, mutable=["intermediates"])
  captured = state["intermediates"]
  outputs = {}
  for layer in layers(flat):
    node = captured
    for part in layer.split("/"):
      node = node[part]
    outputs[layer] = node["__call__"][0].reshape(x.shape[0], -1).astype(jnp.float32)
  return outputs


def layer_cka(model, before: dict, after: dict, x: jax.Array) -> jax.Array:
  """[L]: `linear_cka` of each layer's outputs (`layer_outputs`, layers in network order)
  under params `before` and `after` of `model` on the same inputs x [n, ...]."""
  first, second = layer_outputs(model, before, x), layer_outputs(model, after, x)
  return jnp.stack([linear_cka(first[layer], second[layer]) for layer in layers(before)])
