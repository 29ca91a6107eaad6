"""Quality of a learned representation: the class-by-class mean cosine similarity of its
features (FedAvg-FT paper, Fig. 4) and a one-number summary of it.

Good features for classification are similar within a class and dissimilar across
classes: ideally the matrix has ones on its diagonal and zeros off it.
"""

import jax
import jax.numpy as jnp


def class_cosine_similarity(features: jax.Array, labels: jax.Array,
                            num_classes: int) -> jax.Array:
  """[C, C]: entry (a, b) is the mean of cos(h, h') over the pairs of distinct examples
  with features h, h' (rows of features [N, F]) and labels a, b (labels [N]).

  A zero feature vector (e.g. all ReLUs off) has cosine 0 with everything. Rows whose
  label is outside [0, C) (e.g. -1 for padding) are left out. An entry with no pair (a
  class with no example, or a diagonal one with a single example) is NaN. Jittable
  (num_classes static); O(N F + C^2 F) work, no N x N matrix.
  """
  norms = jnp.linalg.norm(features, axis=-1, keepdims=True)
  units = jnp.where(norms > 0, features / jnp.where(norms > 0, norms, 1.0), 0.0)
  onehot = jax.nn.one_hot(labels, num_classes, dtype=features.dtype)  # [N, C]
  sums = onehot.T @ units  # [C, F]: sum of each class's unit vectors
  sizes = onehot.sum(axis=0)
  self_pairs = onehot.T @ jnp.sum(units * units, axis=-1)  # [C]: sum of cos(h, h) per class
  totals = sums @ sums.T - jnp.diag(self_pairs)
  pairs = sizes[:, None] * sizes[None, :] - jnp.diag(sizes)
  return jnp.where(pairs > 0, totals / jnp.where(pairs > 0, pairs, 1.0), jnp.nan)


def similarity_gap(matrix: jax.Array) -> jax.Array:
  """Mean diagonal minus mean off-diagonal entry of a class similarity matrix [C, C]
  (C >= 2; NaN entries left out): 1 for ideal features, about 0 when classes look alike."""
  diagonal = jnp.eye(matrix.shape[0], dtype=bool)
  return (jnp.nanmean(jnp.where(diagonal, matrix, jnp.nan))
          - jnp.nanmean(jnp.where(diagonal, jnp.nan, matrix)))
