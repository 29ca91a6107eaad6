"""FedAvg with tau local SGD steps per round, and D-SGD (FedAvg-FT paper, Eqs. 2-3).

Each sampled client starts from the global model and takes `local_steps` minibatch SGD
steps on its own data: a fixed number of steps, not of epochs, so a client with few
samples cycles through several shuffled epochs in a round and one with many sees part of
one. The server averages the models weighted by sample counts (as `FedAvg`). D-SGD
(mini-batch SGD, "FedAvg with tau = 1" in the paper) is the same with local_steps = 1:
one step from the global model, then averaging, so its round is one SGD step along the
count-weighted mean of the cohort's minibatch gradients; a comparison at equal local work
runs it tau times as many rounds. With one step per round the optimiser state, created
afresh each round, never carries momentum.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import NNHparams


def sgd_steps(loss_fn: Callable, params, x: jax.Array, y: jax.Array, count: jax.Array,
              key: jax.Array, hparams: NNHparams, *, steps: int, batch_size: int):
  """`steps` minibatch SGD steps on one client's data; returns (params, mean loss).

  loss_fn, x [m, ...], y [m] with `count` real rows, and the optimiser (fresh at each
  call) as in `train.sgd_epochs`. The minibatches walk through shuffled epochs of the real
  rows: with E = ceil(count / batch_size) minibatches per epoch, step s takes minibatch
  s mod E of epoch s div E (the last minibatch of an epoch holds the count mod batch_size
  left-over rows, if any). With (key_order, key_step) = split(key), epoch e's order is
  `train.epoch_order(fold_in(key_order, e), count, m)` and step s's key (dropout) is
  fold_in(key_step, s). The mean loss is over the steps. A client without data takes
  weight-decay steps only (the server gives it weight 0).
  """
  size = x.shape[0]
  tx = train.optimizer(hparams)
  grad_fn = jax.value_and_grad(loss_fn)
  per_epoch = jnp.maximum((count + batch_size - 1) // batch_size, 1)
  key_order, key_step = jax.random.split(key)

  def step(carry, s):
    params, opt_state = carry
    epoch, start = s // per_epoch, (s % per_epoch) * batch_size
    order = train.epoch_order(jax.random.fold_in(key_order, epoch), count, size)
    rows = jax.lax.dynamic_slice_in_dim(jnp.pad(order, (0, batch_size)), start, batch_size)
    weights = ((start + jnp.arange(batch_size)) < count).astype(jnp.float32)
    loss, params, opt_state = train.sgd_step(grad_fn, tx, params, opt_state, x[rows], y[rows],
                                             weights, jax.random.fold_in(key_step, s))
    return (params, opt_state), loss

  (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), jnp.arange(steps))
  return params, jnp.mean(losses)


@dataclasses.dataclass(frozen=True)
class FedAvgSteps(Personalized):
  """FedAvg (one global model; with ft_epochs > 0 each client fine-tunes the head before
  it is tested) whose clients take `local_steps` SGD steps a round (`sgd_steps`) instead
  of `local_epochs` epochs. local_steps = 1 is D-SGD."""
  local_steps: int = 1
  ft_epochs: int = 0
  name: str = "fedavg-steps"

  def __post_init__(self):
    if isinstance(self.local_steps, bool) or not isinstance(self.local_steps, int) \
        or self.local_steps < 1:
      raise ValueError(f"local_steps must be an integer >= 1, got {self.local_steps!r}")

  def labels(self, flat):
    return params_lib.all_shared(flat)

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    flat = params_lib.merge(shared, personal)
    trained, loss = sgd_steps(self.loss, flat, x, y, count, key, hparams,
                              steps=self.local_steps, batch_size=self.batch_size)
    return (*params_lib.split(trained, self.labels(trained)), loss)

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    return self.fine_tuned(params_lib.merge(shared, personal), x, y, count, key, hparams,
                           self.ft_epochs)
