"""FedRoD (Chen & Chao, ICLR 2022): a generic model trained with the balanced softmax and,
at every client, a personal head added to its logits (as PFLlib's clientrod.py runs it).

The server keeps the generic model (body, generic head); every client keeps a personal
head ('personal/head/kernel', 'personal/head/bias'), which starts as the initial generic
head. A sampled client trains for `local_epochs`; on each minibatch, with h = body(x)
[b, F], g = generic head(h) and p = personal head(h) (logits [b, C]), it takes one step on
gradient_only(CE(g + log n, y)) + CE(stop_gradient(g) + p(stop_gradient(h)), y): body and
generic head get the balanced-softmax loss's gradient alone (Ren et al. 2020; n [C] the
client's class counts over its whole training set, `balanced_cross_entropy`), the personal
head the personal CE's alone. It sends body and generic head; the server averages them by
sample counts. Clients are tested with g + p, the logits of one head whose kernel and bias
are the two heads' sums (`eval_params`). The reported loss is CE(g + p, y), the mean over
the local minibatches. PFLlib's choices and the departures: docs/papers/flute.md.
"""

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.algorithm import Personalized

PERSONAL = "personal/"  # a client's personal head: 'personal/head/kernel', ...


def class_counts(y: jax.Array, count: jax.Array, num_classes: int) -> jax.Array:
  """n [num_classes] (float32): how many of the first `count` labels of y [m] are each
  class (the rest are padding)."""
  real = (jnp.arange(y.shape[0]) < count).astype(jnp.float32)
  return real @ jax.nn.one_hot(y, num_classes)


def balanced_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array,
                           counts: jax.Array) -> jax.Array:
  """sum_j w_j CE(logits_j + log n, labels_j) / sum_j w_j (0 when all weights are 0), the
  balanced softmax of logits [b, C] with class counts n = counts [C], written as
  log sum_c n_c exp(logits_jc) - logits_jy - log n_y: a class with n_c = 0 drops out of
  the normaliser with gradient 0 (no log 0 = -inf enters), and rows of weight 0 (padding,
  whose label may be such a class) count 0 without turning the loss or its gradient NaN."""
  log_norm = jax.nn.logsumexp(logits, axis=-1, b=counts)
  label_logits = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
  losses = log_norm - label_logits - jnp.log(jnp.maximum(counts[labels], 1.0))
  return jnp.sum(weights * jnp.where(weights > 0, losses, 0.0)) / jnp.maximum(
      jnp.sum(weights), 1.0)


def personal_head(personal: dict) -> dict:
  """The personal head as a head ('head/kernel', 'head/bias') of a client's personal dict."""
  return {p.removeprefix(PERSONAL): v for p, v in personal.items()}


@dataclasses.dataclass(frozen=True)
class FedRoD(Personalized):
  name: str = "fedrod"

  def labels(self, flat):
    return params_lib.all_shared(flat)

  def initial_parts(self, flat):
    return flat, {PERSONAL + p: v for p, v in flat.items() if p.startswith("head/")}

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    counts = class_counts(y, count, shared["head/bias"].shape[-1])

    def loss(params, xb, yb, wb, k):
      model, own = params
      body, head = params_lib.split(model, params_lib.head_personal(model))
      h = self.features(body, xb)  # both heads with key k: one dropout draw on h, as PFLlib
      generic = self.head_logits(head, h, k)
      mine = self.head_logits(personal_head(own), jax.lax.stop_gradient(h), k)
      personalised = jax.lax.stop_gradient(generic) + mine
      return (train.gradient_only(balanced_cross_entropy(generic, yb, wb, counts))
              + train.cross_entropy(personalised, yb, wb))

    (model, own), mean_loss = self.sgd(loss, (shared, personal), x, y, count, key, hparams,
                                       self.local_epochs)
    return model, own, mean_loss

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    own = personal_head(personal)
    return {**shared, **{p: shared[p] + v for p, v in own.items()}}
