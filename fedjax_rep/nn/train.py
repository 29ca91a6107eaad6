"""Local training of one client: epochs of minibatch SGD (optax) over its padded dataset.

A client's dataset is padded to m rows, of which the first `count` are real. Each epoch
draws a shuffle of the real rows (from the client's own key, `fold_in(round_key,
client_id)`, folded with the epoch; the shuffle is drawn over the m rows), cuts it into
minibatches and runs the ceil(count / batch_size) of them that hold real rows (a loop
with that trip count): padding rows weigh 0 in the loss (a minibatch's loss is the mean
over its real rows) and no step runs on padding alone. So a client trains as it would
alone on its unpadded data, and all clients of a cohort run as one `vmap` (whose loop
runs as many steps as its largest client needs, the others' parameters held).
"""

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from optax import tree_utils as otu

from fedjax_rep.nn import conventions
from fedjax_rep.nn.hparams import NNHparams


def optimizer(hparams: NNHparams) -> optax.GradientTransformation:
  """SGD with weight decay added to the gradient, then heavy-ball momentum (PyTorch's SGD).
  Built from traced numbers inside the round, so it never becomes a static argument. With
  the option `no_bias_decay` (`conventions`; absent: every parameter decays), biases decay
  by weight_decay (1 - no_bias_decay): none where it is 1, as the authors' codes do."""
  no_bias_decay = hparams.options.get(conventions.FLAG_OF["bias_decay"])
  if no_bias_decay is None:
    decay = optax.add_decayed_weights(hparams.weight_decay)
  else:
    decay = optax.chain(
        optax.add_decayed_weights(hparams.weight_decay, mask=lambda p: biases(p, False)),
        optax.add_decayed_weights(hparams.weight_decay * (1 - no_bias_decay),
                                  mask=lambda p: biases(p, True)))
  return optax.chain(decay, optax.sgd(hparams.lr, momentum=hparams.momentum))


def biases(params, want: bool):
  """A bool per leaf of `params`: whether (want=True), or whether not (False), the leaf is
  a bias: the last key of its path names one ('.../bias', as flax names them)."""
  def is_bias(path) -> bool:
    last = str(getattr(path[-1], "key", "")) if path else ""
    return last.rsplit("/", 1)[-1] == "bias"

  return jax.tree_util.tree_map_with_path(lambda path, _: is_bias(path) == want, params)


def epoch_order(key: jax.Array, count: jax.Array, size: int) -> jax.Array:
  """Indices [size] of one epoch: a uniform shuffle of range(count) (the real rows), then
  the padding rows count..size-1 in order."""
  scores = jnp.where(jnp.arange(size) < count, jax.random.uniform(key, (size,)), 2.0)
  return jnp.argsort(scores)


def cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
  """sum_j weights_j CE(logits_j, labels_j) / sum_j weights_j (0 when all weights are 0)."""
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return jnp.sum(weights * losses) / jnp.maximum(jnp.sum(weights), 1.0)


def gradient_only(term: jax.Array) -> jax.Array:
  """A loss term that adds the gradient of `term` but 0 to the loss's value (term minus its
  stop_gradient): regularisers and corrections (FedProx, Ditto, SCAFFOLD) steer training
  while the reported loss stays the cross-entropy, comparable across algorithms."""
  return term - jax.lax.stop_gradient(term)


def sq_distance(a, b) -> jax.Array:
  """||a - b||^2 summed over all leaves of two pytrees of the same structure."""
  return otu.tree_norm(otu.tree_sub(a, b), squared=True)


def sgd_step(grad_fn: Callable, tx: optax.GradientTransformation, params, opt_state, x, y,
             weights, key):
  """One optimiser step on a minibatch: (loss at params, new params, new opt_state), with
  grad_fn = jax.value_and_grad of a minibatch loss as `sgd_epochs` takes."""
  loss, grads = grad_fn(params, x, y, weights, key)
  updates, opt_state = tx.update(grads, opt_state, params)
  return loss, optax.apply_updates(params, updates), opt_state


def sgd_epochs(loss_fn: Callable, params, x: jax.Array, y: jax.Array, count: jax.Array,
               key: jax.Array, hparams: NNHparams, *, epochs: int, batch_size: int,
               active: jax.Array | None = None, trainable=None):
  """`epochs` epochs of minibatch SGD on one client's data; returns (params, mean loss).
  (`sgd_epochs_from` with a fresh optimiser state.)"""
  params, _, loss = sgd_epochs_from(loss_fn, params, optimizer(hparams).init(params), x, y,
                                    count, key, hparams, epochs=epochs,
                                    batch_size=batch_size, active=active,
                                    trainable=trainable)
  return params, loss


def sgd_epochs_from(loss_fn: Callable, params, opt_state, x: jax.Array, y: jax.Array,
                    count: jax.Array, key: jax.Array, hparams: NNHparams, *, epochs: int,
                    batch_size: int, active: jax.Array | None = None, trainable=None):
  """`epochs` epochs of minibatch SGD on one client's data from the optimiser state
  `opt_state` (of `optimizer(hparams)` for params like `params`); returns (params, its
  optimiser state, mean loss).

  loss_fn(params, x_batch [b, ...], y_batch [b], weights [b], key) -> the weighted mean
  loss of a minibatch (weights: 1 for real rows, 0 for padding); `key` is the step's key
  (dropout). x [m, ...], y [m] with `count` real rows. (`sgd_epochs` starts the
  optimiser afresh, as a client's optimiser is created each round in FedRep's code; FLUTE*'s
  head-first order carries one across its phases.) The mean loss is over the steps that
  have real rows (0 with no epochs).

  Traced variants of the same training, for one program that serves several algorithms:
  `active` (int []; None: `epochs`) runs only the first `active` of the `epochs` epochs
  (the others are skipped: the epoch keys are those of `active` epochs, as `split` keys
  are prefixes of each other); `trainable` (a pytree of bool [] like params; None: all)
  keeps the leaves where it is False at their value (frozen).
  """
  size = x.shape[0]
  steps = math.ceil(size / batch_size)
  tx = optimizer(hparams)
  grad_fn = jax.value_and_grad(loss_fn)

  def epoch(carry, inputs):
    index, epoch_key = inputs
    if active is None:
      return run_epoch(carry, epoch_key), None
    return jax.lax.cond(index < active, run_epoch, lambda carry, _: carry, carry,
                        epoch_key), None

  def run_epoch(carry, epoch_key):
    key_order, key_steps = jax.random.split(epoch_key)
    order = jnp.pad(epoch_order(key_order, count, size), (0, steps * batch_size - size))

    def step(s, carry):  # step s < ceil(count / batch_size): it has a real row
      params, opt_state, total = carry
      start = s * batch_size
      step_key = step_keys[s]
      rows = jax.lax.dynamic_slice_in_dim(order, start, batch_size)
      weights = ((start + jnp.arange(batch_size)) < count).astype(jnp.float32)
      loss, new_params, opt_state = sgd_step(grad_fn, tx, params, opt_state, x[rows], y[rows],
                                             weights, step_key)
      if trainable is not None:
        new_params = jax.tree.map(jnp.where, trainable, new_params, params)
      return new_params, opt_state, total + loss

    step_keys = jax.random.split(key_steps, steps)
    real_steps = jnp.minimum((count + batch_size - 1) // batch_size, steps)
    return jax.lax.fori_loop(0, real_steps, step, carry)

  carry = (params, opt_state, jnp.float32(0.0))
  params, opt_state, total = jax.lax.scan(epoch, carry, (jnp.arange(epochs),
                                                         jax.random.split(key, epochs)))[0]
  real_steps = (epochs if active is None else active) * jnp.ceil(count / batch_size)
  return params, opt_state, total / jnp.maximum(real_steps, 1.0)


def tested(logits: jax.Array, labels: jax.Array, count: jax.Array):
  """(accuracy [], hits []) of the first `count` rows of logits [t, C]: hits (int32) are the
  rows whose argmax is the label [t], the accuracy hits / count (0 where count is 0)."""
  real = jnp.arange(labels.shape[0]) < count
  hits = jnp.sum((jnp.argmax(logits, axis=-1) == labels) & real, dtype=jnp.int32)
  return hits / jnp.maximum(count, 1), hits
