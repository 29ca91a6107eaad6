"""The model's pieces (logits, features, head), local SGD and the fine-tuning of the head
before testing, as methods of an algorithm with the fields `model` (a `models.Classifier`)
and `batch_size`."""

import jax

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.hparams import FT_EPOCHS


class ModelSteps:
  """Forward passes and SGD epochs of `self.model` for `Personalized`'s hooks."""

  def logits(self, flat: dict, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
    """Logits [b, C] of inputs x [b, ...]; dropout on where `key` is given (training)."""
    return self.model.apply({"params": params_lib.unflatten(flat)}, x, train=key is not None,
                            rngs=None if key is None else {"dropout": key})

  def features(self, body: dict, x: jax.Array) -> jax.Array:
    """The body's output [b, F] (deterministic) of inputs x [b, ...]; body: 'body/...'."""
    return self.model.apply({"params": params_lib.unflatten(body)}, x,
                            method=self.model.features)

  def head_logits(self, head: dict, h: jax.Array, key: jax.Array | None = None) -> jax.Array:
    """Logits [b, C] of the head ('head/...') on features h [b, F]."""
    return self.model.apply({"params": params_lib.unflatten(head)}, h, train=key is not None,
                            rngs=None if key is None else {"dropout": key},
                            method=self.model.logits)

  def loss(self, flat, x, y, weights, key):
    """Weighted cross-entropy of the whole model (a minibatch loss for `train.sgd_epochs`)."""
    return train.cross_entropy(self.logits(flat, x, key), y, weights)

  def sgd(self, loss_fn, params, x, y, count, key, hparams, epochs: int, **traced):
    """`train.sgd_epochs` with this algorithm's batch size (`traced`: its `active` and
    `trainable`)."""
    return train.sgd_epochs(loss_fn, params, x, y, count, key, hparams, epochs=epochs,
                            batch_size=self.batch_size, **traced)

  def train_head(self, body: dict, head: dict, x, y, count, key, hparams, epochs: int,
                 **traced):
    """(head, mean loss) after `epochs` of SGD on the head alone (`traced`: as `sgd`'s), on
    the frozen body's features (computed once)."""
    h = self.features(body, x)
    loss = lambda p, hb, yb, wb, k: train.cross_entropy(self.head_logits(p, hb, k), yb, wb)
    return self.sgd(loss, head, h, y, count, key, hparams, epochs, **traced)

  def head_trained(self, flat: dict, x, y, count, key, hparams, epochs: int, active=None):
    """flat with its head trained for `epochs` epochs on the frozen body's features
    (`train_head`); with `active` (int []), only the first `active` of them, and nothing
    (not even the features) where it is 0."""
    body, head = params_lib.split(flat, params_lib.head_personal(flat))

    def train():
      return self.train_head(body, head, x, y, count, key, hparams, epochs, active=active)[0]

    return params_lib.merge(body, train() if active is None else
                            jax.lax.cond(active > 0, train, lambda: head))

  def fine_tuned(self, flat: dict, x, y, count, key, hparams, epochs: int) -> dict:
    """The params a client is tested with after fine-tuning: flat with its head trained for
    `epochs` epochs (`head_trained`; the option FT_EPOCHS of hparams, where present, says
    how many of them run), flat itself where epochs is 0. x [m, ...], y [m], count real
    rows: the client's training data."""
    if not epochs:
      return flat
    return self.head_trained(flat, x, y, count, key, hparams, epochs,
                             hparams.options.get(FT_EPOCHS))
