"""L2GD (Hanzely & Richtarik 2020): loopless local gradient descent on personal models
pulled together by (l2gd_lambda / 2n) sum_i ||x_i - x_bar||^2.

Every client keeps its own full model x_i. Each round flips one coin: with probability
l2gd_p it is an averaging round, where the cohort's models move towards their
count-weighted mean, x_i <- x_i - theta (x_i - x_bar) with theta = min(1, lr l2gd_lambda
/ l2gd_p); otherwise a local round, where each client of the cohort trains its model for
`local_epochs` with step size lr / (1 - l2gd_p). These are the paper's unbiased
steps, lr playing the paper's alpha / n; l2gd_p and l2gd_lambda are traced options
(defaults 0.2 and 10). Clients are tested with their own x_i. The
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
from fedjax_rep.nn.hparams import Option


@dataclasses.dataclass(frozen=True)
class L2GD(Personalized):
  options = (Option("l2gd_p", 0.2, high=1.0, open=True,
                     help="L2GD's probability of an averaging round"),
             Option("l2gd_lambda", 10.0,
                    help="L2GD's penalty lambda on the distance to the mean model"))
  name: str = "l2gd"

  def labels(self, flat):
    return params_lib.all_personal(flat)

  def exchanged(self, shared, personal, hparams):
    """In an averaging round (a share l2gd_p of the rounds) the client's model up and the
    cohort's mean down; nothing in a local round."""
    return personal, personal, self.option(hparams, "l2gd_p")

  def masked_round(self, state, key, data, hparams, clients, mask=None):
    key_coin, key_clients = jax.random.split(key)
    p, lam = self.option(hparams, "l2gd_p"), self.option(hparams, "l2gd_lambda")
    local_hparams = hparams.replace(lr=hparams.lr / (1 - p))
    local_round = super().masked_round

    def local(_):
      return local_round(state, key_clients, data, local_hparams, clients, mask)

    def average(_):
      weights = data.sample_counts(clients)
      weights = weights if mask is None else jnp.where(mask, weights, 0.0)
      models = tree.gather(state.personal, clients)
      center = aggregate.weighted_mean(models, weights)
      theta = jnp.minimum(hparams.lr * lam / p, 1.0)
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

    return jax.lax.cond(jax.random.uniform(key_coin) < p, average, local, None)
