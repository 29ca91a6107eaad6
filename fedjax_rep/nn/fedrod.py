"""FedRoD (Chen & Chao, ICLR 2022, "On Bridging Generic and Personalized Federated Learning
for Image Classification"): a generic model trained with the balanced softmax and, at every
client, a personal head on top of it.

The server keeps the generic model (body and generic head); every client keeps its own
personal head ('personal/head/kernel', 'personal/head/bias'). A sampled client trains from
the server's model and its personal head for `local_epochs`; at every minibatch, with
h = body(x) [b, F], g = generic head(h) and p = personal head(h) (logits [b, C]),

- body and generic head take a step on the balanced-softmax loss (Ren et al. 2020)
  CE(g + log n, y), n [C] the client's class counts over its whole training set
  (`balanced_cross_entropy`);
- the personal head takes a step on CE(stop_gradient(g) + p(stop_gradient(h)), y).

The server averages body and generic head weighted by sample counts (as FedAvg); clients
are tested with g + p. Choices the paper leaves open, as PFLlib's clientrod.py and
serverrod.py make them:

- the personal head starts as the initial generic head (PFLlib deep-copies the initial
  model's head), the same for every client;
- the two steps of a minibatch use the same h and g (computed before either step), so
  they are one optimiser step on gradient_only(balanced loss) + personal CE, whose terms
  meet only through stop_gradient: the body and generic head get the balanced loss's
  gradient alone, the personal head the personal CE's alone. The optimiser acts
  parameter by parameter, so this is exactly two optimisers with the same settings;
- the client sends its body and generic head; the personal head never leaves it;
- the reported loss is the personalised model's cross-entropy CE(g + p, y), as PFLlib's
  train_metrics reports (here the mean over the local minibatches, as every algorithm
  reports, not a pass over the training set after training).

Departures from PFLlib: its two optimisers are plain SGD at one learning rate; ours is
`train.optimizer` (weight decay, momentum) for both, its momentum restarting every round
(PFLlib keeps its optimisers across rounds, which matters only with momentum). PFLlib
counts the classes over the batches of one shuffle with drop_last (so a few samples may be
left out); here n counts all the client's training samples. With a linear head, g + p is
the logits of one head whose kernel and bias are the sums of the two heads' (dropout is off
at test time), which is what `eval_params` returns.
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
