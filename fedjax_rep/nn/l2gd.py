"""L2GD (Hanzely & Richtarik 2020): loopless local gradient descent on personal models
pulled together by (l2gd_lambda / 2n) sum_i ||x_i - x_bar||^2.

Every client keeps its own full model x_i. Each round flips one coin: with probability
l2gd_p it is an averaging round, where the cohort's models move towards their
count-weighted mean, x_i <- x_i - theta (x_i - x_bar) with theta = min(1, lr l2gd_lambda
/ l2gd_p); otherwise a local round, where each client of the cohort trains its model for
`local_epochs` with step size lr / (1 - l2gd_p). These are the paper's unbiased
steps, lr playing the paper's alpha / n. Clients are tested with their own x_i. The
reported loss is the local training loss, and in averaging rounds the cohort's
cross-entropy on its training data before the move.
"""

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_rep.core import aggregate
from fedjax_rep.core import tree
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.algorithm import Personalized


@dataclasses.dataclass(frozen=True)
class L2GD(Personalized):
  l2gd_p: float = 0.2
  l2gd_lambda: float = 10.0
  name: str = "l2gd"

  def __post_init__(self):
    if not 0 < self.l2gd_p < 1:
      raise ValueError(f"l2gd_p (the probability of an averaging round) must be in (0, 1), "
                       f"got {self.l2gd_p}")
    if not self.l2gd_lambda >= 0:
      raise ValueError(f"l2gd_lambda must be >= 0, got {self.l2gd_lambda}")

  def labels(self, flat):
    return params_lib.all_personal(flat)

  def exchanged(self, shared, personal, hparams):
    """In an averaging round (a share l2gd_p of the rounds) the client's model up and the
    cohort's mean down; nothing in a local round."""
    return personal, personal, self.l2gd_p

  def masked_round(self, state, key, data, hparams, clients, mask=None):
    key_coin, key_clients = jax.random.split(key)
    local_hparams = hparams.replace(lr=hparams.lr / (1 - self.l2gd_p))
    local_round = super().masked_round

    def local(_):
      return local_round(state, key_clients, data, local_hparams, clients, mask)

    def average(_):
      weights = data.sample_counts(clients)
      weights = weights if mask is None else jnp.where(mask, weights, 0.0)
      models = tree.gather(state.personal, clients)
      center = aggregate.weighted_mean(models, weights)
      theta = jnp.minimum(hparams.lr * self.l2gd_lambda / self.l2gd_p, 1.0)
      moves = (weights > 0).astype(jnp.float32) * theta
      moved = jax.tree.map(
          lambda m, c: m - moves.reshape(-1, *[1] * (m.ndim - 1)) * (m - c), models, center)

      def client_loss(flat, x, y, count):
        real = (jnp.arange(x.shape[0]) < count).astype(jnp.float32)
        return train.cross_entropy(self.logits(flat, x), y, real)

      losses = data.map_clients(client_loss, models, clients, self.client_group)
      state_out = state.replace(personal=tree.scatter(state.personal, clients, moved))
      return (self.finish_round(state_out, clients, weights, mask, hparams),
              {"train_loss": aggregate.weighted_mean(losses, weights)})

    return jax.lax.cond(jax.random.uniform(key_coin) < self.l2gd_p, average, local, None)
