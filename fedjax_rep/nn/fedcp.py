"""FedCP (Zhang et al., KDD 2023): a conditional policy network (CPN) splits each sample's
features between a personal and the global head, as PFLlib's clientcp.py/servercp.py run it.

A client has the server's body psi and CPN, its personal head (W_p, b_p) and the server's
global head (W_g, b_g; frozen in local training). On h = psi(x) [b, F] the CPN scores
s = ReLU(LayerNorm(Dense_2F(h * c))) [b, 2, F], c [F] the personal kernel [F, C] summed
over the classes, L2-normalised (no gradient); the masks are (m_p, m_g) = softmax((s + g)
/ TAU) over the pair axis (a soft Gumbel-softmax, TAU = 1) and the logits
head_p(h * m_p) + head_g(h * m_g). A sampled client trains body, personal head and CPN for
`local_epochs` on CE + fedcp_lambda MMD^2(psi(x), psi_0(x)), psi_0 the round's global body
(frozen), MMD^2 the 'rbf' estimate (means over all pairs of real rows, diagonal included)
with the kernel sum_a exp(-|u - v|^2 / (2a)), a in BANDWIDTHS, a gradient-only term. It
sends body, CPN and 0.5 (personal head) + 0.5 (global head), averaged by sample counts. The
Gumbel noise g is drawn from each step's key (the first of its split), in evaluation from
the client's evaluation key (MASK_KEY). Departures from PFLlib: docs/papers/flute.md.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import train
from fedjax_rep.nn.algorithm import Personalized
from fedjax_rep.nn.hparams import Option

BODY, HEAD, GLOBAL_HEAD, CPN = "body/", "head/", "global_head/", "cpn/"
MASK_KEY = "mask_key"  # eval_params' entry: the client's evaluation key (its key data)
TAU = 1.0
BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


class ConditionalPolicy(nn.Module):
  """The CPN: policy inputs [b, F] -> scores [b, 2, F] (personal, global) =
  ReLU(LayerNorm(fc(inputs))), fc: Dense F -> 2F at the model's matmul `precision`."""
  precision: Any = None

  @nn.compact
  def __call__(self, inputs: jax.Array) -> jax.Array:
    f = inputs.shape[-1]
    scores = nn.Dense(2 * f, precision=self.precision, name="fc")(inputs)
    scores = nn.relu(nn.LayerNorm(epsilon=1e-5, use_fast_variance=False, name="norm")(scores))
    return scores.reshape(*inputs.shape[:-1], 2, f)


def part(flat: dict, prefix: str) -> dict:
  """The entries of `flat` whose names start with `prefix`."""
  return {p: v for p, v in flat.items() if p.startswith(prefix)}


def renamed(flat: dict, old: str, new: str) -> dict:
  """The entries of `flat` under prefix `old`, renamed to prefix `new`."""
  return {new + p.removeprefix(old): v for p, v in part(flat, old).items()}


def context(flat: dict) -> jax.Array:
  """The client's context [F]: its personal head's kernel ('head/kernel' [F, C]) summed over
  the classes, L2-normalised, without gradient."""
  c = jax.lax.stop_gradient(jnp.sum(flat[HEAD + "kernel"], axis=-1))
  return c / jnp.maximum(jnp.linalg.norm(c), 1e-12)


def masks(scores: jax.Array, noise: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(personal mask, global mask) [b, F]: the soft Gumbel-softmax over the pair axis of
  scores [b, 2, F] with Gumbel noise [b, 2, F] and temperature TAU."""
  both = jax.nn.softmax((scores + noise) / TAU, axis=-2)
  return both[..., 0, :], both[..., 1, :]


def mmd(x: jax.Array, y: jax.Array, weights: jax.Array) -> jax.Array:
  """MMD^2 [] of features x, y [b, F] over the rows of weight 1 (weights [b]: 1 or 0):
  mean k(x, x') + mean k(y, y') - 2 mean k(x, y), k summed over BANDWIDTHS."""
  def kernel(u, v):
    distances = jnp.sum((u[:, None] - v[None]) ** 2, axis=-1)
    return sum(jnp.exp(-0.5 * distances / a) for a in BANDWIDTHS)

  pairs = jnp.outer(weights, weights) / jnp.maximum(jnp.sum(weights), 1.0) ** 2
  return jnp.sum(pairs * (kernel(x, x) + kernel(y, y) - 2.0 * kernel(x, y)))


@dataclasses.dataclass(frozen=True)
class FedCP(Personalized):
  """State: shared {'body/...', 'global_head/...', 'cpn/...'}, personal {'head/...'}."""
  options = (Option("fedcp_lambda", 5.0, help="FedCP's weight of the MMD between the local "
                                               "and the round's global features (0: off)"),)
  name: str = "fedcp"

  def initial_parts(self, flat):
    body, head = params_lib.split(flat, params_lib.head_personal(flat))
    return {**body, **renamed(head, HEAD, GLOBAL_HEAD)}, head  # every head starts the same

  def init(self, key, data, hparams):
    """`Personalized.init`, and the CPN's initial params (from fold_in(key, 0), apart from
    the model's and evaluation's keys, split(key)) in the shared params."""
    state = super().init(key, data, hparams)
    features = state.shared[GLOBAL_HEAD + "kernel"].shape[0]
    cpn = ConditionalPolicy(self.model.precision).init(jax.random.fold_in(key, 0),
                                                       jnp.zeros((1, features)))
    cpn = {CPN + p: v for p, v in params_lib.flatten(cpn["params"]).items()}
    return state.replace(shared={**state.shared, **cpn})

  def policy(self, flat: dict, h: jax.Array, c: jax.Array) -> jax.Array:
    """The CPN's ('cpn/...' of flat) scores [b, 2, F] of features h [b, F], context c [F]."""
    cpn = params_lib.unflatten(renamed(flat, CPN, ""))
    return ConditionalPolicy(self.model.precision).apply({"params": cpn}, h * c)

  def ensemble(self, flat: dict, x: jax.Array, c: jax.Array, key: jax.Array,
               train_mode: bool = False):
    """(logits [b, C], the body's features h [b, F]) of inputs x [b, ...] with context c [F]:
    head_p(h m_p) + head_g(h m_g), the masks' noise from the first of split(key) (the
    second: the heads' dropout, in training)."""
    key_mask, key_dropout = jax.random.split(key)
    h = self.features(part(flat, BODY), x)
    scores = self.policy(flat, h, c)
    personal_mask, global_mask = masks(scores, jax.random.gumbel(key_mask, scores.shape))
    dropout = key_dropout if train_mode else None
    logits = (self.head_logits(part(flat, HEAD), h * personal_mask, dropout)
              + self.head_logits(renamed(flat, GLOBAL_HEAD, HEAD), h * global_mask, dropout))
    return logits, h

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    body, global_head = part(shared, BODY), part(shared, GLOBAL_HEAD)
    c = context(personal)  # the head's at the start of the round, fixed through it

    def loss(params, xb, yb, wb, k):
      logits, h = self.ensemble({**params, **global_head}, xb, c, k, train_mode=True)
      alignment = self.option(hparams, "fedcp_lambda") * mmd(h, self.features(body, xb), wb)
      return train.cross_entropy(logits, yb, wb) + train.gradient_only(alignment)

    trained, mean_loss = self.sgd(loss, {**body, **part(shared, CPN), **personal}, x, y,
                                  count, key, hparams, self.local_epochs)
    head = part(trained, HEAD)
    upload = renamed(head, HEAD, GLOBAL_HEAD)  # 0.5 personal + 0.5 global head
    upload = {p: 0.5 * v + 0.5 * global_head[p] for p, v in upload.items()}
    return {**part(trained, BODY), **part(trained, CPN), **upload}, head, mean_loss

  def eval_params(self, shared, personal, x, y, count, key, hparams):
    """Shared + personal params, and the client's evaluation key (MASK_KEY: the key data of
    its test masks' Gumbel noise)."""
    return {**shared, **personal, MASK_KEY: jax.random.key_data(key)}

  def logits(self, flat, x, key=None):
    """Evaluation's logits [b, C] of `eval_params`' flat params (`ensemble`, its mask noise
    from MASK_KEY); params without MASK_KEY (`new_clients`: body and a head) as a plain
    classifier's."""
    if MASK_KEY not in flat:
      return super().logits(flat, x, key)
    return self.ensemble(flat, x, context(flat), jax.random.wrap_key_data(flat[MASK_KEY]))[0]
